-- sql/functions/enqueue.sql: pgq.enqueue and pgq.enqueue_many.

-- Validates the enqueue arguments shared by enqueue, enqueue_many and schedule (the payloads and
-- unique_key are checked by each), raising 22004 / 22023 naming the first that is wrong.
CREATE OR REPLACE FUNCTION pgq._check_enqueue(queue text, kind text, run_at timestamptz, priority integer,
                                              max_attempts integer, tenant text, max_run_time interval,
                                              meta jsonb, concurrency_key text)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._check_name('queue', _check_enqueue.queue);
    PERFORM pgq._check_name('kind', _check_enqueue.kind);
    IF _check_enqueue.run_at IS NULL THEN
        PERFORM pgq._bad_argument('run_at', 'must not be NULL', 'Omit it to run now.');
    ELSIF NOT isfinite(_check_enqueue.run_at) THEN
        PERFORM pgq._bad_argument('run_at', format('must be a finite time, got %s', _check_enqueue.run_at));
    END IF;
    IF _check_enqueue.priority IS NULL THEN
        PERFORM pgq._bad_argument('priority', 'must not be NULL', 'Omit it for priority 0.');
    ELSIF _check_enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM pgq._bad_argument('priority',
            format('must be between -1000 and 1000, got %s', _check_enqueue.priority));
    END IF;
    IF _check_enqueue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', _check_enqueue.max_attempts));
    END IF;
    IF length(_check_enqueue.tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('tenant', 'must be 1 to 256 characters long');
    END IF;
    IF _check_enqueue.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', _check_enqueue.max_run_time, interval '365 days');
    END IF;
    IF _check_enqueue.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', _check_enqueue.meta);
    END IF;
    PERFORM pgq._check_concurrency_key('concurrency_key', _check_enqueue.concurrency_key);
END
$$;

-- Validates pgq.enqueue's start_by (a finite time after now and after run_at: a job that could
-- not start before it would only expire) and max_lifetime (a span of more than 0, at most 3650
-- days), 22023 naming the first that is wrong; NULL is no such limit.
CREATE OR REPLACE FUNCTION pgq._check_lifetime(run_at timestamptz, start_by timestamptz, max_lifetime interval)
    RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF _check_lifetime.start_by IS NOT NULL THEN
        IF NOT isfinite(_check_lifetime.start_by) THEN
            PERFORM pgq._bad_argument('start_by', format('must be a finite time, got %s', _check_lifetime.start_by));
        ELSIF _check_lifetime.start_by <= pgq._now() THEN
            PERFORM pgq._bad_argument('start_by', format('must be later than now (%s), got %s', pgq._now(),
                                                         _check_lifetime.start_by),
                'A job not claimed by start_by is cancelled: give a time ahead.');
        ELSIF _check_lifetime.start_by <= _check_lifetime.run_at THEN
            PERFORM pgq._bad_argument('start_by', format('must be later than run_at (%s), got %s',
                                                         _check_lifetime.run_at, _check_lifetime.start_by),
                'A job is claimed at run_at at the earliest.');
        END IF;
    END IF;
    IF _check_lifetime.max_lifetime IS NOT NULL THEN
        PERFORM pgq._check_interval('max_lifetime', _check_lifetime.max_lifetime, interval '3650 days');
    END IF;
END
$$;

-- Validates pgq.enqueue's and pgq.enqueue_many's on_conflict (22004 / 22023).
CREATE OR REPLACE FUNCTION pgq._check_on_conflict(on_conflict text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_on_conflict.on_conflict IS NULL THEN
        PERFORM pgq._bad_argument('on_conflict', 'must not be NULL', 'Omit it for ''keep''.');
    ELSIF _check_on_conflict.on_conflict NOT IN ('keep', 'replace') THEN
        PERFORM pgq._bad_argument('on_conflict',
            format('must be ''keep'' or ''replace'', got %s', left(quote_literal(_check_on_conflict.on_conflict), 40)),
            'keep: the live job that holds unique_key is the answer; replace: a holder this login enqueued '
            'that has not started takes the new payload, run_at, priority, meta and max_attempts.');
    END IF;
END
$$;

-- Validates pgq.enqueue's and pgq.enqueue_many's dependency_mode and notify_finished (22004 / 22023).
CREATE OR REPLACE FUNCTION pgq._check_workflow(dependency_mode text, notify_finished boolean) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_workflow.dependency_mode IS NULL THEN
        PERFORM pgq._bad_argument('dependency_mode', 'must not be NULL', 'Omit it for ''all_done''.');
    ELSIF _check_workflow.dependency_mode NOT IN ('all_done', 'all_ended') THEN
        PERFORM pgq._bad_argument('dependency_mode',
            format('must be ''all_done'' or ''all_ended'', got %s', quote_literal(_check_workflow.dependency_mode)),
            'all_done: released when every dependency is done; all_ended: when every one has ended, however.');
    END IF;
    IF _check_workflow.notify_finished IS NULL THEN
        PERFORM pgq._bad_argument('notify_finished', 'must not be NULL', 'Omit it for false.');
    END IF;
END
$$;

-- pgq._replace_key's update of the job it replaces (locked by it): the call's fields, and the event.
CREATE OR REPLACE FUNCTION pgq._replace_job(id bigint, attempt integer, state pgq.job_state, queue text,
                                            payload jsonb, run_at timestamptz, priority integer, meta jsonb,
                                            max_attempts integer)
    RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE pgq.jobs AS j
    SET payload = _replace_job.payload, run_at = _replace_job.run_at, priority = _replace_job.priority,
        meta = _replace_job.meta, max_attempts = greatest(_replace_job.max_attempts, j.attempt + 1)
    WHERE j.id = _replace_job.id;
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT _replace_job.id, _replace_job.attempt, NULL, 'replaced', _replace_job.state, _replace_job.state, NULL
    FROM pgq.queues AS q WHERE q.name = _replace_job.queue AND q.audit;
$$;

-- Whether the session's login may replace a job enqueued by `enqueued_by`: it enqueued it, or it
-- is a member of pgq_admin (a job enqueued before 0017, NULL, is an admin's to replace only).
CREATE OR REPLACE FUNCTION pgq._enqueued_it(enqueued_by text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT coalesce($1 = session_user::text, false) OR pg_has_role(session_user, 'pgq_admin', 'MEMBER') $$;

-- pgq._replace_key's lock of a job of the key that has not started (its holder or its successor):
-- FOR NO KEY UPDATE SKIP LOCKED, as a claim locks it, so a holder that a claim (or a worker's end)
-- holds counts as started and is never waited for. A 'waiting' job is never claimed: what holds
-- one is an end's cascade, a sweep or a settle call moving it on, in a transaction of its own that
-- is over at once, so for a 'waiting' job the lock is tried again, by polling, up to 50 ms (then it
-- counts as started, as before). Without that, a replace that met a waiting successor while a
-- sweep released it put a third job of the key behind it. Returns the job locked (id, state,
-- attempt), or NULLs.
CREATE OR REPLACE FUNCTION pgq._lock_unstarted(job_id bigint, OUT id bigint, OUT state pgq.job_state,
                                               OUT attempt integer)
    LANGUAGE plpgsql
    AS $$
DECLARE
    give_up timestamptz;
BEGIN
    LOOP
        SELECT j.id, j.state, j.attempt INTO id, state, attempt
        FROM pgq.jobs AS j WHERE j.id = _lock_unstarted.job_id FOR NO KEY UPDATE OF j SKIP LOCKED;
        EXIT WHEN FOUND OR NOT EXISTS (SELECT FROM pgq.jobs AS j
                                       WHERE j.id = _lock_unstarted.job_id AND j.state = 'waiting');
        give_up := coalesce(give_up, clock_timestamp() + interval '50 milliseconds');
        EXIT WHEN clock_timestamp() >= give_up;
        PERFORM pg_sleep(0.001);
    END LOOP;
END
$$;

-- pgq.enqueue(..., unique_key, on_conflict => 'replace'), before anything is inserted. A replace
-- writes and holds only the caller's own jobs (issue 37): the holder or successor it updates was
-- enqueued by the caller's login (or the caller is an admin). Against another login's holder it is
-- a keep: that holder's id is the answer (kept), and nothing is written or locked (an open replace
-- once hid another producer's job from claims, made its producer's enqueues of the key and an
-- admin's cancel wait, and rewrote its payload, run_at and max_attempts). A unique key is the
-- queue's: one live holder, whoever enqueued it, as in Oban, River and graphile-worker; a replace
-- never adds a second job of the key beside another login's.
--
-- * The caller's slot of the key is taken first: its login's row of pgq.replace_slots, locked
--   till commit. The replace calls of one login and key take turns on it; those of other logins
--   never wait for it.
-- * The slot's successor, if live, the caller's and not started: it takes the call's fields and its
--   id is the answer (it is the key's last job to run), whatever the holder's state. One that has
--   started, or that another transaction holds, is waited for by the new job (after_ids): the jobs
--   of one key run one after the other.
-- * Another login's live holder: a keep (above).
-- * The caller's holder that has not started (pending, due or not, or waiting): it takes the call's
--   payload, run_at, priority, meta and max_attempts (never below its attempt + 1) and its id is
--   the answer (replaced_id). Its kind, tenant, concurrency_key, max_run_time, dependencies and
--   batch stay its own. Its row is locked without waiting (SKIP LOCKED), as a claim locks it: a
--   claim in flight skips it until this transaction ends, and a holder that a claim (or any other
--   transaction) holds now counts as started.
-- * The caller's holder that has started (running or outcome_unknown): it is left alone, and a new
--   job is enqueued without the key, waiting for the holder (all_ended: it runs once the holder has
--   ended, however): after_ids names the holder, keyed is false. The slot remembers that job; a
--   later replace call of the login, while the job has not started, updates it instead (so a
--   debounce enqueues at most one job behind a running one).
-- * No holder: the new job takes the key (keyed).
-- Workers never read that table, and no row of a job is waited for: a producer's replace never
-- waits for a worker, and its open transaction holds no worker's job (only its own job not started).
-- A 'keep' call does not take a slot: it answers with the holder only (not a successor).
-- (Named _replace_key since 0021: pgq._replace, before, returned no `kept`, and a function's
-- result type cannot be changed in place.)
CREATE OR REPLACE FUNCTION pgq._replace_key(queue text, unique_key text, payload jsonb, run_at timestamptz,
                                            priority integer, meta jsonb, max_attempts integer,
                                            OUT replaced_id bigint, OUT after_ids bigint[], OUT keyed boolean,
                                            OUT kept boolean)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    holder    record;
    target    record;
    successor bigint;
    succ_busy boolean := false;
    login     text := session_user;
BEGIN
    kept := false;
    LOOP
        INSERT INTO pgq.replace_slots AS s (queue, unique_key, enqueued_by)
        VALUES (_replace_key.queue, _replace_key.unique_key, login)
        ON CONFLICT ON CONSTRAINT replace_slots_pkey DO NOTHING;
        EXIT WHEN FOUND;  -- ours, new: no successor
        SELECT s.job_id INTO successor FROM pgq.replace_slots AS s
        WHERE s.queue = _replace_key.queue AND s.unique_key = _replace_key.unique_key AND s.enqueued_by = login
        FOR UPDATE;
        EXIT WHEN FOUND;  -- else deleted by the call we waited for: insert it again
    END LOOP;
    -- The successor first, if it is live, ours and has not started: it is the key's last job to run.
    IF successor IS NOT NULL THEN
        SELECT l.id, l.state, l.attempt INTO target  -- (only ours: NULL locks nothing)
        FROM pgq._lock_unstarted((SELECT j.id FROM pgq.jobs AS j
                                  WHERE j.id = successor AND pgq._enqueued_it(j.enqueued_by))) AS l;
        IF target.id IS NOT NULL AND target.state IN ('waiting', 'pending') THEN
            PERFORM pgq._replace_job(target.id, target.attempt, target.state, _replace_key.queue, _replace_key.payload,
                                     _replace_key.run_at, _replace_key.priority, _replace_key.meta, _replace_key.max_attempts);
            replaced_id := target.id;
            RETURN;
        END IF;
        -- Started, or held by another transaction (a claim in flight), or ended.
        succ_busy := target.id IS NOT NULL AND target.state IN ('running', 'outcome_unknown')
                     OR target.id IS NULL AND EXISTS (SELECT FROM pgq.jobs AS j WHERE j.id = successor
                                                      AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown'));
    END IF;
    LOOP
        SELECT j.id, j.state, j.enqueued_by INTO holder
        FROM pgq.jobs AS j
        WHERE j.queue = _replace_key.queue AND j.unique_key = _replace_key.unique_key
          AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
        IF holder.id IS NOT NULL AND NOT pgq._enqueued_it(holder.enqueued_by) THEN
            -- Another login's holder: a keep. The slot stays only for a successor of ours in flight.
            IF NOT succ_busy THEN
                DELETE FROM pgq.replace_slots AS s
                WHERE s.queue = _replace_key.queue AND s.unique_key = _replace_key.unique_key AND s.enqueued_by = login;
            END IF;
            replaced_id := holder.id;
            kept := true;
            RETURN;
        END IF;
        EXIT WHEN holder.id IS NULL OR holder.state IN ('running', 'outcome_unknown');
        SELECT l.id, l.state, l.attempt INTO target FROM pgq._lock_unstarted(holder.id) AS l;
        IF target.id IS NOT NULL AND target.state IN ('waiting', 'pending') THEN
            PERFORM pgq._replace_job(target.id, target.attempt, target.state, _replace_key.queue, _replace_key.payload,
                                     _replace_key.run_at, _replace_key.priority, _replace_key.meta, _replace_key.max_attempts);
            IF NOT succ_busy THEN
                -- The key needs no successor.
                DELETE FROM pgq.replace_slots AS s
                WHERE s.queue = _replace_key.queue AND s.unique_key = _replace_key.unique_key AND s.enqueued_by = login;
            END IF;
            replaced_id := target.id;
            RETURN;
        END IF;
        -- Held by another transaction (a claim in flight): it counts as started. Started or ended
        -- since it was read: read again.
        IF target.id IS NULL AND EXISTS (SELECT FROM pgq.jobs AS j WHERE j.id = holder.id
                                         AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')) THEN
            holder.state := 'running';
            EXIT;
        END IF;
    END LOOP;
    after_ids := CASE WHEN succ_busy THEN ARRAY[successor] ELSE '{}' END;
    IF holder.id IS NOT NULL THEN
        -- A started holder: a new job without the key waits for it (and for a busy successor); the
        -- caller records it as the successor.
        after_ids := after_ids || holder.id;
        keyed := false;
        RETURN;
    END IF;
    -- No holder: the new job takes the key (after a busy successor).
    keyed := true;
    DELETE FROM pgq.replace_slots AS s
    WHERE s.queue = _replace_key.queue AND s.unique_key = _replace_key.unique_key AND s.enqueued_by = login;
END
$$;

-- Validates enqueue's unique_for: NULL (none), or a span of more than 0 and at most 3650 days
-- given with a unique_key (`keyed`), 22023 naming unique_for.
CREATE OR REPLACE FUNCTION pgq._check_unique_for(keyed boolean, unique_for interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_unique_for.unique_for IS NOT NULL THEN
        PERFORM pgq._check_interval('unique_for', _check_unique_for.unique_for, interval '3650 days');
        IF NOT _check_unique_for.keyed THEN
            PERFORM pgq._bad_argument('unique_for', 'needs a unique_key (unique_keys for enqueue_many)',
                'unique_for is how long a job of the key that finished done still holds it.');
        END IF;
    END IF;
END
$$;

-- The job that holds a unique_key for enqueue's unique_for: a live one (waiting, pending, running,
-- outcome_unknown), else the newest of the key that ended done within unique_for of now (finished
-- after now - unique_for; failed and cancelled jobs never hold a key, as in River's and Oban's
-- default states). One statement, so one snapshot: a holder that ends while it runs is seen live or
-- done, never neither. `other_than`: a job to leave out (the caller's own insert). Each read is one
-- probe of an index (jobs_unique_key_idx, jobs_unique_done_idx). NULL: none.
CREATE OR REPLACE FUNCTION pgq._key_holder(queue text, unique_key text, unique_for interval,
                                           other_than bigint DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT j.id FROM pgq.jobs AS j
         WHERE j.queue = _key_holder.queue AND j.unique_key = _key_holder.unique_key AND j.unique_key IS NOT NULL
           AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')
           AND j.id IS DISTINCT FROM _key_holder.other_than),
        (SELECT j.id FROM pgq.jobs AS j
         WHERE j.queue = _key_holder.queue AND j.unique_key = _key_holder.unique_key AND j.unique_key IS NOT NULL
           AND j.state = 'done' AND j.finished_at > pgq._now() - _key_holder.unique_for
         ORDER BY j.finished_at DESC
         LIMIT 1))
$$;

CREATE OR REPLACE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL, concurrency_key text DEFAULT NULL,
                            depends_on bigint[] DEFAULT NULL, dependency_mode text DEFAULT 'all_done',
                            batch bigint DEFAULT NULL, notify_finished boolean DEFAULT false,
                            on_conflict text DEFAULT 'keep', start_by timestamptz DEFAULT NULL,
                            max_lifetime interval DEFAULT NULL, tags text[] DEFAULT NULL,
                            unique_for interval DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    q          pgq.queues;
    new_id     bigint;
    job_tenant text := enqueue.tenant;
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
    mode       text;
    job_key    text := enqueue.unique_key;
    wait_on    bigint[] := enqueue.depends_on;
    wait_mode  text := enqueue.dependency_mode;
    r          record;
    prior_timeout text;  -- the caller's lock_timeout, while a keyed insert bounds its own
    held_by    bigint;   -- the live job that holds the unique_key
    job_tags   text[];   -- tags, each once, sorted (NULL: none)
BEGIN
    -- Every argument checked in one plain expression (no query, no nested call); only a call that
    -- fails it runs the checks that name the bad argument and raise. (The nested checks cost about
    -- a quarter of an enqueue.)
    IF NOT coalesce(pgq._is_name(enqueue.queue)
                    AND pgq._is_name(enqueue.kind)
                    AND isfinite(enqueue.run_at)
                    AND enqueue.priority BETWEEN -1000 AND 1000
                    AND coalesce(enqueue.max_attempts BETWEEN 1 AND 10000, true)
                    AND coalesce(length(enqueue.tenant) BETWEEN 1 AND 256, true)
                    AND jsonb_typeof(enqueue.payload) = 'object'
                    AND pgq._jsonb_size(enqueue.payload) <= 1048576
                    AND coalesce(octet_length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days'
                                 AND pgq._is_span(enqueue.max_run_time), true)
                    AND (enqueue.meta IS NULL OR jsonb_typeof(enqueue.meta) = 'object'
                         AND pgq._jsonb_size(enqueue.meta) <= 1048576)
                    AND coalesce(length(enqueue.concurrency_key) BETWEEN 1 AND 256, true)
                    AND enqueue.dependency_mode IN ('all_done', 'all_ended')
                    AND enqueue.notify_finished IS NOT NULL
                    AND enqueue.on_conflict IN ('keep', 'replace')
                    AND (enqueue.start_by IS NULL OR isfinite(enqueue.start_by) AND enqueue.start_by > pgq._now()
                         AND enqueue.start_by > enqueue.run_at)
                    AND coalesce(enqueue.max_lifetime > interval '0'
                                 AND enqueue.max_lifetime <= interval '3650 days'
                                 AND pgq._is_span(enqueue.max_lifetime), true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant, enqueue.max_run_time, enqueue.meta,
                                   enqueue.concurrency_key);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        PERFORM pgq._check_workflow(enqueue.dependency_mode, enqueue.notify_finished);
        PERFORM pgq._check_on_conflict(enqueue.on_conflict);
        PERFORM pgq._check_lifetime(enqueue.run_at, enqueue.start_by, enqueue.max_lifetime);
    END IF;
    -- tags and unique_for, checked apart: a call that uses neither pays one NULL test (a check in
    -- the expression above, with its query over the tags, made every enqueue about a third slower).
    IF enqueue.tags IS NOT NULL OR enqueue.unique_for IS NOT NULL THEN
        PERFORM pgq._check_tags('tags', enqueue.tags);
        PERFORM pgq._check_unique_for(enqueue.unique_key IS NOT NULL, enqueue.unique_for);
        IF cardinality(enqueue.tags) > 0 THEN
            job_tags := ARRAY(SELECT DISTINCT t.tag FROM unnest(enqueue.tags) AS t(tag) ORDER BY t.tag);
        END IF;
    END IF;
    -- A unique_key that a live job of the queue holds answers at once (on_conflict keep, no
    -- batch, a login that may enqueue there), before the queue's row is locked: a deduplicated
    -- call writes nothing, not even a lock (no transaction id). With unique_for, a job of the key
    -- that ended done within it holds the key too (pgq._key_holder).
    IF enqueue.unique_key IS NOT NULL AND enqueue.on_conflict = 'keep' AND enqueue.batch IS NULL THEN
        IF enqueue.unique_for IS NULL THEN
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
        ELSE
            new_id := pgq._key_holder(enqueue.queue, enqueue.unique_key, enqueue.unique_for);
        END IF;
        IF new_id IS NOT NULL AND NOT EXISTS (SELECT FROM pgq.queues AS s WHERE s.name = enqueue.queue AND s.restricted IS NOT NULL
                                 AND NOT pgq._may(s.name, s.restricted, 'enqueue')) THEN
            RETURN new_id;
        END IF;
    END IF;
    -- The queue's settings, its row held FOR KEY SHARE to commit (its writer lock: see
    -- pgq._queue_to_write, which creates it on first use and waits for a drop in flight).
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue.queue FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        q := pgq._queue_to_write(enqueue.queue);
    END IF;
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;
    IF q.key_limited OR q.rate_limited THEN
        PERFORM pgq._ready_limits(q, enqueue.concurrency_key);  -- the rows its claims hold (keys.sql)
    END IF;
    IF enqueue.batch IS NOT NULL THEN
        PERFORM pgq._join_batch(enqueue.batch);
    END IF;
    -- on_conflict 'replace' (pgq._replace_key): a holder of this login's that has not started takes this
    -- call's fields; behind one that has, the new job waits for it, without the key; another
    -- login's holder is the answer, as for 'keep'.
    IF enqueue.on_conflict = 'replace' AND enqueue.unique_key IS NOT NULL THEN
        r := pgq._replace_key(enqueue.queue, enqueue.unique_key, enqueue.payload, enqueue.run_at, enqueue.priority,
                          enqueue.meta, coalesce(enqueue.max_attempts, q.max_attempts));
        IF r.replaced_id IS NOT NULL THEN
            IF NOT r.kept AND q.notify AND enqueue.run_at <= pgq._now() THEN
                PERFORM pg_notify('pgq', enqueue.queue);
            END IF;
            RETURN r.replaced_id;
        END IF;
        IF NOT r.keyed THEN
            job_key := NULL;
        END IF;
        IF cardinality(r.after_ids) > 0 THEN
            wait_on := coalesce(enqueue.depends_on, '{}') || r.after_ids;
            wait_mode := CASE WHEN enqueue.depends_on IS NULL THEN 'all_ended' ELSE enqueue.dependency_mode END;
        END IF;
    END IF;
    -- With dependencies: waiting for those not done yet (read, not locked: an end of one in flight
    -- now is settled by the check pgq._wait_for_dependencies leaves), or cancelled at once (below)
    -- when one has ended failed or cancelled. An empty array is no dependency. A live job that
    -- holds the unique_key is answered first, so that a deduplicated call writes nothing here either.
    IF wait_on IS NOT NULL THEN
        IF job_key IS NOT NULL THEN
            new_id := pgq._key_holder(enqueue.queue, job_key, coalesce(enqueue.unique_for, interval '0'));
            IF new_id IS NOT NULL THEN
                RETURN new_id;
            END IF;
        END IF;
        deps := pgq._read_dependencies(wait_on, wait_mode);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            mode := wait_mode;
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF job_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time, meta, concurrency_key, state, depends_on,
                                   dependencies_left, dependency_mode, batch_id, notify_finished,
                                   start_by, expires_at, tags)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta, enqueue.concurrency_key, new_state, dep_ids, left_count, mode,
                enqueue.batch, enqueue.notify_finished, enqueue.start_by,
                pgq._now() + enqueue.max_lifetime, job_tags)
        RETURNING j.id INTO new_id;
    ELSE
        -- The insert of a new holder waits (the unique index) for another transaction that inserted
        -- a job of this key and has not ended, another producer's open transaction say: at most
        -- 5 s (or the caller's shorter lock_timeout), then 55P03 naming the key. (A key a committed
        -- job holds is answered before any insert, without a wait.)
        prior_timeout := pgq._bound_lock_timeout(interval '5 seconds');
        BEGIN
            LOOP
                INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                           unique_key, tenant, max_run_time, meta, concurrency_key,
                                           state, depends_on, dependencies_left, dependency_mode, batch_id,
                                           notify_finished, start_by, expires_at, tags)
                VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                        coalesce(enqueue.max_attempts, q.max_attempts), job_key, job_tenant,
                        enqueue.max_run_time, enqueue.meta, enqueue.concurrency_key, new_state, dep_ids,
                        left_count, mode, enqueue.batch, enqueue.notify_finished, enqueue.start_by,
                        pgq._now() + enqueue.max_lifetime, job_tags)
                ON CONFLICT (queue, unique_key)
                    WHERE unique_key IS NOT NULL AND state IN ('waiting', 'pending', 'running', 'outcome_unknown')
                    DO NOTHING
                RETURNING j.id INTO new_id;
                IF FOUND AND enqueue.unique_for IS NOT NULL THEN
                    -- unique_for: the new job holds the key among the live ones (a concurrent
                    -- enqueue of it waits for this transaction), but a job of the key may have been
                    -- enqueued, and ended done, since the check above read (the insert only meets
                    -- live ones). Read once more now that the key is ours: such a job is the
                    -- answer, and the new row goes.
                    held_by := pgq._key_holder(enqueue.queue, job_key, enqueue.unique_for, new_id);
                    IF held_by IS NOT NULL THEN
                        DELETE FROM pgq.jobs AS j WHERE j.id = new_id;
                    END IF;
                END IF;
                EXIT WHEN FOUND;
                -- A live job holds this unique_key: hand back its id. If it finished in the
                -- meantime, the key is free again (or, with unique_for, held by that job, done)
                -- and the INSERT is tried once more.
                held_by := pgq._key_holder(enqueue.queue, job_key, coalesce(enqueue.unique_for, interval '0'));
                EXIT WHEN held_by IS NOT NULL;
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgq: unique_key % of queue % is being enqueued by another transaction that has not ended; '
                            'gave up after lock_timeout %', job_key, enqueue.queue, current_setting('lock_timeout')
                USING ERRCODE = 'lock_not_available',
                      HINT = 'Try again once it has committed (its job then holds the key) or rolled back.';
        END;
        PERFORM set_config('lock_timeout', prior_timeout, true);
        IF held_by IS NOT NULL THEN
            RETURN held_by;
        END IF;
    END IF;
    IF job_key IS NULL AND enqueue.unique_key IS NOT NULL THEN
        -- The successor behind a started holder (pgq._replace_key): later replace calls update it.
        UPDATE pgq.replace_slots AS s SET job_id = new_id
        WHERE s.queue = enqueue.queue AND s.unique_key = enqueue.unique_key AND s.enqueued_by = session_user;
    END IF;

    IF enqueue.batch IS NOT NULL THEN
        PERFORM pgq._batch_added(enqueue.batch, ARRAY[new_id]);
    END IF;
    IF dep_ids IS NOT NULL THEN
        INSERT INTO pgq.job_dependants (depends_on, job_id) SELECT d.id, new_id FROM unnest(dep_ids) AS d(id);
    END IF;
    IF new_state = 'waiting' THEN
        PERFORM pgq._wait_for_dependencies(ARRAY[new_id], deps.open_ids, deps.ended_id, deps.ended_state);
        RETURN new_id;
    END IF;
    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[], text, bigint, boolean, text, timestamptz, interval, text[], interval) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it '
    '(on_conflict keep), or replaces its payload, run_at, priority, meta and max_attempts if it has '
    'not started and the caller''s login enqueued it (replace; behind such a started holder a new job '
    'waits for it; another login''s holder is kept). '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim. depends_on: the job '
    'waits until those jobs are done (dependency_mode all_done: cancelled if one fails or is cancelled) '
    'or have ended however (all_ended). batch: joins that open batch. notify_finished: its end '
    'notifies channel pgq_finished. tags: up to 16 tags (1 to 64 characters) for the tags filters. '
    'unique_for (with unique_key): a job of the key that ended done within it holds the key too.';

CREATE OR REPLACE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL,
                                 concurrency_key text DEFAULT NULL, depends_on bigint[] DEFAULT NULL,
                                 dependency_mode text DEFAULT 'all_done', batch bigint DEFAULT NULL,
                                 notify_finished boolean DEFAULT false, unique_keys text[] DEFAULT NULL,
                                 on_conflict text DEFAULT 'keep', tags text[] DEFAULT NULL,
                                 unique_for interval DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
    new_ids    bigint[];
    mode       text;
    job_tags   text[];  -- tags, each once, sorted (NULL: none)
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant,
                               enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key);
    PERFORM pgq._check_workflow(enqueue_many.dependency_mode, enqueue_many.notify_finished);
    PERFORM pgq._check_on_conflict(enqueue_many.on_conflict);
    IF enqueue_many.tags IS NOT NULL OR enqueue_many.unique_for IS NOT NULL THEN
        PERFORM pgq._check_tags('tags', enqueue_many.tags);
        PERFORM pgq._check_unique_for(enqueue_many.unique_keys IS NOT NULL, enqueue_many.unique_for);
        IF cardinality(enqueue_many.tags) > 0 THEN
            job_tags := ARRAY(SELECT DISTINCT t.tag FROM unnest(enqueue_many.tags) AS t(tag) ORDER BY t.tag);
        END IF;
    END IF;
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pgq._jsonb_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    IF enqueue_many.unique_keys IS NOT NULL THEN
        -- One key per payload (NULL: none), each a valid unique_key, none twice: checked before
        -- anything is written. Then each payload is enqueued as pgq.enqueue would (its conflict
        -- rule, dependencies, batch), in payload order, in this one call.
        IF cardinality(enqueue_many.unique_keys) <> cardinality(enqueue_many.payloads)
           OR array_ndims(enqueue_many.unique_keys) > 1 THEN
            PERFORM pgq._bad_argument('unique_keys',
                format('must have one key (or NULL) per payload: %s keys for %s payloads',
                       cardinality(enqueue_many.unique_keys), cardinality(enqueue_many.payloads)));
        END IF;
        SELECT k.value, k.n INTO bad
        FROM unnest(enqueue_many.unique_keys) WITH ORDINALITY AS k(value, n)
        WHERE octet_length(k.value) NOT BETWEEN 1 AND 1024
        LIMIT 1;
        IF FOUND THEN
            PERFORM pgq._bad_argument(format('unique_keys[%s]', bad.n),
                format('must be 1 to 1024 bytes long (UTF-8), got %s bytes', octet_length(bad.value)),
                'Hash a longer key, e.g. md5(key).');
        END IF;
        SELECT k.value, min(k.n) AS n INTO bad
        FROM unnest(enqueue_many.unique_keys) WITH ORDINALITY AS k(value, n)
        WHERE k.value IS NOT NULL
        GROUP BY k.value HAVING count(*) > 1
        ORDER BY min(k.n) LIMIT 1;
        IF FOUND THEN
            PERFORM pgq._bad_argument('unique_keys',
                format('names the key %s more than once (first at unique_keys[%s])', left(quote_literal(bad.value), 60), bad.n),
                'One call enqueues at most one job per key.');
        END IF;
        IF enqueue_many.depends_on IS NOT NULL
           AND cardinality(enqueue_many.depends_on)::bigint * cardinality(enqueue_many.payloads) > 10000 THEN
            PERFORM pgq._bad_argument('depends_on',
                format('names %s jobs for %s payloads: more than the 10000 links one call writes',
                       cardinality(enqueue_many.depends_on), cardinality(enqueue_many.payloads)));
        END IF;
        RETURN QUERY
        SELECT pgq.enqueue(enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.run_at, enqueue_many.priority,
                           enqueue_many.max_attempts, enqueue_many.unique_keys[p.n], enqueue_many.tenant,
                           enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
                           enqueue_many.depends_on, enqueue_many.dependency_mode, enqueue_many.batch,
                           enqueue_many.notify_finished, enqueue_many.on_conflict, NULL, NULL,
                           enqueue_many.tags,
                           CASE WHEN enqueue_many.unique_keys[p.n] IS NOT NULL THEN enqueue_many.unique_for END)
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n;
        RETURN;
    END IF;
    -- The queue's settings, its row held FOR KEY SHARE to commit (as in pgq.enqueue).
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue_many.queue FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        q := pgq._queue_to_write(enqueue_many.queue);
    END IF;
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;
    IF q.key_limited OR q.rate_limited THEN
        PERFORM pgq._ready_limits(q, enqueue_many.concurrency_key);  -- the rows its claims hold (keys.sql)
    END IF;
    IF enqueue_many.batch IS NOT NULL THEN
        PERFORM pgq._join_batch(enqueue_many.batch);
    END IF;
    -- The same dependencies for every job, as in pgq.enqueue. One call writes at most 10000 links
    -- (the product of the payloads and the jobs named, whatever their states: the same call is
    -- accepted or refused whenever it is made), as many as one pgq.enqueue naming 10000 jobs.
    IF enqueue_many.depends_on IS NOT NULL THEN
        deps := pgq._read_dependencies(enqueue_many.depends_on, enqueue_many.dependency_mode);
        IF cardinality(deps.ids)::bigint * cardinality(enqueue_many.payloads) > 10000 THEN
            PERFORM pgq._bad_argument('depends_on',
                format('names %s jobs for %s payloads: %s links, and one call writes at most 10000 '
                       '(payloads x jobs named)', cardinality(deps.ids), cardinality(enqueue_many.payloads),
                       cardinality(deps.ids)::bigint * cardinality(enqueue_many.payloads)),
                'Split the payloads over several calls, or make them depend on one job that depends on the others.');
        END IF;
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            mode := enqueue_many.dependency_mode;
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF new_state = 'pending' AND dep_ids IS NULL AND enqueue_many.batch IS NULL THEN
        -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
        -- the ids in payload order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                                  meta, concurrency_key, batch_id, notify_finished, tags)
            SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
                   enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
                   job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
                   enqueue_many.batch, enqueue_many.notify_finished, job_tags
            FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
            ORDER BY p.n
            RETURNING jobs.id
        )
        SELECT i.id FROM inserted AS i ORDER BY i.id;

        IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
            PERFORM pg_notify('pgq', enqueue_many.queue);
        END IF;
        RETURN;
    END IF;

    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                              meta, concurrency_key, state, depends_on, dependencies_left, dependency_mode,
                              batch_id, notify_finished, tags)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
               new_state, dep_ids, left_count, mode, enqueue_many.batch, enqueue_many.notify_finished, job_tags
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') INTO new_ids FROM inserted AS i;
    IF enqueue_many.batch IS NOT NULL AND cardinality(new_ids) > 0 THEN
        PERFORM pgq._batch_added(enqueue_many.batch, new_ids);
    END IF;
    INSERT INTO pgq.job_dependants (depends_on, job_id)
    SELECT d.id, n.id FROM unnest(dep_ids) AS d(id) CROSS JOIN unnest(new_ids) AS n(id);
    IF new_state = 'waiting' THEN
        PERFORM pgq._wait_for_dependencies(new_ids, deps.open_ids, deps.ended_id, deps.ended_state);
    ELSIF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(new_ids) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
    RETURN QUERY SELECT unnest(new_ids);
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[], text, bigint, boolean, text[], text, text[], interval) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta, depends_on, dependency_mode, batch and notify_finished. unique_keys: one '
    'key per payload (NULL: none), each enqueued as pgq.enqueue does with on_conflict and unique_for. '
    'tags: the same tags for every job.';
