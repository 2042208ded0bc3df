-- sql/functions/queues.sql: queue rows and their settings: configure_queue, pause, resume,
-- drop_queue.

-- The queue's settings row, created with the defaults on first use.
CREATE OR REPLACE FUNCTION pgq._queue(name text) RETURNS pgq.queues
    LANGUAGE plpgsql
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _queue.name;
    IF NOT FOUND THEN
        PERFORM pgq._check_name('queue', _queue.name);
        INSERT INTO pgq.queues AS s (name) VALUES (_queue.name) ON CONFLICT DO NOTHING;
        SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _queue.name;
    END IF;
    RETURN q;
END
$$;

-- The queue's settings row for a call that writes jobs into it (enqueue, enqueue_many), held FOR
-- KEY SHARE to the caller's commit and created with the defaults on first use: the queue's writer
-- lock. pgq.drop_queue and the pruning of idle tenants (pgq.prune) take the row FOR UPDATE, which
-- conflicts with it and with nothing else (claims, pause and configure_queue take it FOR NO KEY
-- UPDATE): they see every job written into the queue. It is a row of pgq's own table, which only
-- the schema owner can lock (an advisory key, which it was, any login may take). The callers try
-- the row with SKIP LOCKED first (one statement); this is their way on when the row is absent or
-- held FOR UPDATE: it waits for a drop or a prune in flight, or for another session's first
-- enqueue into the queue, which created its row and has not committed, at most lock_timeout (5 s),
-- then 55P03 naming the queue.
CREATE OR REPLACE FUNCTION pgq._queue_to_write(name text) RETURNS pgq.queues
    LANGUAGE plpgsql
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    PERFORM pgq._check_name('queue', _queue_to_write.name);
    BEGIN
        LOOP
            SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _queue_to_write.name FOR KEY SHARE;
            EXIT WHEN FOUND;
            INSERT INTO pgq.queues AS s (name) VALUES (_queue_to_write.name) ON CONFLICT DO NOTHING;
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: queue % is being created, dropped or pruned by a transaction that has not ended; '
                        'gave up after lock_timeout %', _queue_to_write.name, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'Another session''s first enqueue into it, or a pgq.drop_queue or pgq.prune of it, '
                         'sits in an open transaction: let it end, and try again.';
    END;
    RETURN q;
END
$$;

-- The settings row of a queue that must exist: 22023 naming the argument and the queue otherwise
-- (a typo must not create a queue, nor act on nothing).
CREATE OR REPLACE FUNCTION pgq._existing_queue(argument text, name text) RETURNS pgq.queues
    LANGUAGE plpgsql
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _existing_queue.name;
    IF NOT FOUND THEN
        PERFORM pgq._check_name(argument, name);
        PERFORM pgq._bad_argument(argument, format('names no queue: %s', quote_literal(name)),
            'A queue is created by its first job or by pgq.configure_queue; pgq.stats() lists them.');
    END IF;
    RETURN q;
END
$$;

-- The queue row for an admin call, locked (FOR NO KEY UPDATE, or FOR UPDATE to delete it), or
-- NULL when there is none. Admin calls wait for another session's lock on a queue row at most
-- lock_timeout (5 s: this function's and theirs): an idle transaction that claimed from a capped
-- queue holds its row until it ends (and, for a drop, one that enqueued into it). Then 55P03,
-- naming the queue.
CREATE OR REPLACE FUNCTION pgq._lock_queue(name text, for_delete boolean DEFAULT false) RETURNS pgq.queues
    LANGUAGE plpgsql
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    BEGIN
        IF for_delete THEN
            SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _lock_queue.name FOR UPDATE;
        ELSE
            SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _lock_queue.name FOR NO KEY UPDATE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: queue % is locked by another session; gave up after lock_timeout %',
            _lock_queue.name, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'A transaction that claimed from it (or enqueued into it, or changes it) has not ended: see '
                         'pgq.health() (idle_in_transaction) or pg_stat_activity, end it, and try again.';
    END;
    RETURN q;
END
$$;

-- A retention (configure_queue's retention, retention_failed, retention_cancelled): a span (no
-- months or years) between 0 and 3650 days, or NULL (unchanged); 22023 naming the argument.
CREATE OR REPLACE FUNCTION pgq._check_retention(argument text, value interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._check_span(_check_retention.argument, _check_retention.value);
    IF _check_retention.value < interval '0' OR _check_retention.value > interval '3650 days' THEN
        PERFORM pgq._bad_argument(_check_retention.argument,
            format('must be between 0 and 3650 days, got %s', _check_retention.value));
    END IF;
END
$$;

-- pgq.configure_queue's arguments, checked against the queue's settings `q` (a backoff_cap below
-- the backoff_base it would have): 22023 naming the first that is wrong; NULL leaves a setting as
-- it is.
CREATE OR REPLACE FUNCTION pgq._check_queue_settings(q pgq.queues, lease interval, max_attempts integer,
                                                     backoff_base interval, backoff_cap interval,
                                                     retention interval, max_running integer,
                                                     max_run_time interval, key_max_running integer,
                                                     rate_limit integer, rate_period interval,
                                                     key_rate_limit integer, retention_failed interval,
                                                     retention_cancelled interval, max_wait interval)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_queue_settings.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', _check_queue_settings.lease, interval '1 day');
    END IF;
    IF _check_queue_settings.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', _check_queue_settings.max_attempts));
    END IF;
    IF _check_queue_settings.backoff_base IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_base', _check_queue_settings.backoff_base, interval '365 days');
    END IF;
    IF _check_queue_settings.backoff_cap IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_cap', _check_queue_settings.backoff_cap, interval '365 days');
    END IF;
    IF coalesce(_check_queue_settings.backoff_cap, q.backoff_cap)
       < coalesce(_check_queue_settings.backoff_base, q.backoff_base) THEN
        PERFORM pgq._bad_argument('backoff_cap', 'must not be less than backoff_base');
    END IF;
    PERFORM pgq._check_retention('retention', _check_queue_settings.retention);
    PERFORM pgq._check_retention('retention_failed', _check_queue_settings.retention_failed);
    PERFORM pgq._check_retention('retention_cancelled', _check_queue_settings.retention_cancelled);
    IF _check_queue_settings.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no cap) and 100000, got %s', _check_queue_settings.max_running));
    END IF;
    IF _check_queue_settings.key_max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('key_max_running',
            format('must be between 0 (no limit) and 100000, got %s', _check_queue_settings.key_max_running));
    END IF;
    PERFORM pgq._check_span('max_run_time', _check_queue_settings.max_run_time);
    IF _check_queue_settings.max_run_time < interval '0' OR _check_queue_settings.max_run_time > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_run_time',
            format('must be between 0 (no limit) and 365 days, got %s', _check_queue_settings.max_run_time));
    END IF;
    IF _check_queue_settings.rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', _check_queue_settings.rate_limit));
    END IF;
    IF _check_queue_settings.rate_period IS NOT NULL THEN
        PERFORM pgq._check_interval('rate_period', _check_queue_settings.rate_period, interval '1 day');
    END IF;
    IF _check_queue_settings.key_rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('key_rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', _check_queue_settings.key_rate_limit));
    END IF;
    PERFORM pgq._check_span('max_wait', _check_queue_settings.max_wait);
    IF _check_queue_settings.max_wait < interval '0' OR _check_queue_settings.max_wait > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_wait',
            format('must be between 0 (strict priority) and 365 days, got %s', _check_queue_settings.max_wait));
    END IF;
END
$$;

-- A queue switched to fair mode (pgq.configure_queue): the jobs already in it join, those without
-- a tenant get the tenant '', and every tenant gets its row. (Switch a queue to fair mode before
-- producers use it: an enqueue that read the queue's settings before this commits stores no
-- tenant, and fair claims do not see such a job until it is given one.)
CREATE OR REPLACE FUNCTION pgq._make_fair(queue text)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE pgq.jobs AS j SET tenant = ''
    WHERE j.queue = _make_fair.queue AND j.tenant IS NULL AND j.state <> 'done';
    INSERT INTO pgq.tenants AS t (queue, tenant)
    SELECT DISTINCT j.queue, j.tenant FROM pgq.jobs AS j
    WHERE j.queue = _make_fair.queue AND j.tenant IS NOT NULL AND j.state <> 'done'
    ON CONFLICT DO NOTHING;
END
$$;

-- pgq.configure_queue's key_sequence, checked against the queue's settings `q` and the call's
-- other arguments (NULL: unchanged): 'halt', 'continue' or 'off' (ends it), else 22023 naming
-- key_sequence. A sequence runs one job of a key at a time, so it refuses (22023 naming
-- key_sequence, or the other argument when the call changes only that in a sequence queue) what
-- says otherwise or picks another way: key_max_running above 1, per-key overrides
-- (pgq.key_limits: pgq.set_key_limit refuses them in a sequence queue), fair mode.
-- (max_wait refuses a sequence queue itself.) Nothing is written before it has passed.
CREATE OR REPLACE FUNCTION pgq._check_key_sequence(q pgq.queues, key_sequence text, fair boolean,
                                                   key_max_running integer)
    RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    seq text := CASE WHEN _check_key_sequence.key_sequence IS NULL THEN q.key_sequence
                     ELSE nullif(_check_key_sequence.key_sequence, 'off') END;
BEGIN
    IF _check_key_sequence.key_sequence NOT IN ('halt', 'continue', 'off') THEN
        PERFORM pgq._bad_argument('key_sequence',
            format('must be ''halt'', ''continue'', ''off'' or NULL (unchanged), got %s',
                   quote_literal(left(_check_key_sequence.key_sequence, 64))),
            '''halt'': a job that fails for good holds its key''s later jobs; ''continue'': they go on.');
    END IF;
    IF seq IS NULL THEN
        RETURN;
    ELSIF _check_key_sequence.key_sequence IS NULL AND _check_key_sequence.key_max_running > 1 THEN
        PERFORM pgq._bad_argument('key_max_running', format('must be 0 or 1 in a sequence queue (key_sequence %s), '
                                                            'got %s', q.key_sequence, _check_key_sequence.key_max_running),
            'A sequence runs one job of a key at a time.');
    ELSIF _check_key_sequence.key_sequence IS NULL AND _check_key_sequence.fair THEN
        PERFORM pgq._bad_argument('fair', format('cannot be turned on in a sequence queue (key_sequence %s)',
                                                 q.key_sequence),
            'pgq.configure_queue(queue, key_sequence => ''off'') ends the sequences first.');
    ELSIF coalesce(_check_key_sequence.key_max_running, q.key_max_running) > 1 THEN
        PERFORM pgq._bad_argument('key_sequence', 'runs one job of a key at a time: key_max_running must be 0 or 1',
            'Set key_max_running => 0 with key_sequence.');
    ELSIF coalesce(_check_key_sequence.fair, q.fair) THEN
        PERFORM pgq._bad_argument('key_sequence', 'does not apply to a fair queue',
            'Set fair => false with key_sequence, or use another queue.');
    ELSIF EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = q.name) THEN
        PERFORM pgq._bad_argument('key_sequence', 'runs one job of a key at a time: the queue has per-key limits',
            'Remove them first: pgq.set_key_limit(queue, key, NULL) for each key that has one.');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgq.configure_queue(queue text, lease interval DEFAULT NULL,
                                    max_attempts integer DEFAULT NULL,
                                    backoff_base interval DEFAULT NULL,
                                    backoff_cap interval DEFAULT NULL,
                                    retention interval DEFAULT NULL,
                                    notify boolean DEFAULT NULL, audit boolean DEFAULT NULL,
                                    fair boolean DEFAULT NULL, max_running integer DEFAULT NULL,
                                    max_run_time interval DEFAULT NULL,
                                    key_max_running integer DEFAULT NULL,
                                    rate_limit integer DEFAULT NULL,
                                    rate_period interval DEFAULT NULL,
                                    key_rate_limit integer DEFAULT NULL,
                                    retention_failed interval DEFAULT NULL,
                                    retention_cancelled interval DEFAULT NULL,
                                    keep_done boolean DEFAULT NULL,
                                    max_wait interval DEFAULT NULL,
                                    key_sequence text DEFAULT NULL,
                                    archive boolean DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._queue(configure_queue.queue);
    rate_now     timestamptz;
    new_rate     integer;
    new_period   interval;
    new_key_rate integer;
BEGIN
    q := pgq._lock_queue(configure_queue.queue);
    PERFORM pgq._check_queue_settings(q, configure_queue.lease, configure_queue.max_attempts,
                                      configure_queue.backoff_base, configure_queue.backoff_cap,
                                      configure_queue.retention, configure_queue.max_running,
                                      configure_queue.max_run_time, configure_queue.key_max_running,
                                      configure_queue.rate_limit, configure_queue.rate_period,
                                      configure_queue.key_rate_limit, configure_queue.retention_failed,
                                      configure_queue.retention_cancelled, configure_queue.max_wait);
    PERFORM pgq._check_key_sequence(q, configure_queue.key_sequence, configure_queue.fair,
                                    configure_queue.key_max_running);
    -- Aging serves a plain or capped queue's own pick: a fair, key-limited or rate-limited queue
    -- picks by its tenants, keys or tokens, and refuses it (as it would be ignored).
    IF coalesce(nullif(configure_queue.max_wait, interval '0'), CASE WHEN configure_queue.max_wait IS NULL THEN q.max_wait END)
           IS NOT NULL
       AND (coalesce(configure_queue.fair, q.fair) OR coalesce(configure_queue.key_max_running, q.key_max_running) > 0
            OR coalesce(configure_queue.rate_limit, q.rate_limit) > 0
            OR coalesce(configure_queue.key_rate_limit, q.key_rate_limit) > 0
            OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = configure_queue.queue)
            OR coalesce(nullif(configure_queue.key_sequence, 'off'), CASE WHEN configure_queue.key_sequence IS NULL
                                                                          THEN q.key_sequence END) IS NOT NULL) THEN
        PERFORM pgq._bad_argument('max_wait', 'applies to a plain or capped queue, not to a fair, key-limited, '
                                              'rate-limited or sequence one',
            'Set max_wait => ''0'' (strict priority) with fair, key limits or rate limits.');
    END IF;
    IF configure_queue.fair AND NOT q.fair THEN
        PERFORM pgq._make_fair(configure_queue.queue);
    END IF;
    -- A new rate or period keeps what the buckets handed out: their debt is rescaled to as many
    -- tokens of the new rate (pgq._rescaled_tat, pgq._set_rate_buckets, which waits for the claims
    -- that hold a shard); a rate set to 0 forgets it. A claim in flight meanwhile spends a key's
    -- tokens by the settings it started with: a new rate binds the claims that start after it
    -- commits.
    rate_now := pgq._rate_clock();
    new_rate := coalesce(configure_queue.rate_limit, q.rate_limit);
    new_period := coalesce(configure_queue.rate_period, q.rate_period);
    new_key_rate := coalesce(configure_queue.key_rate_limit, q.key_rate_limit);
    IF new_key_rate = 0 THEN
        DELETE FROM pgq.key_rates AS k WHERE k.queue = configure_queue.queue;
    ELSIF new_key_rate <> q.key_rate_limit OR new_period <> q.rate_period THEN
        UPDATE pgq.key_rates AS k
        SET tat = pgq._rescaled_tat(k.tat, q.key_rate_limit, q.rate_period, new_key_rate, new_period, rate_now)
        WHERE k.queue = configure_queue.queue AND k.tat > rate_now;
    END IF;
    IF new_rate <> q.rate_limit OR (new_rate > 0 AND new_period <> q.rate_period) THEN
        PERFORM pgq._set_rate_buckets(configure_queue.queue, q.rate_period, new_rate, new_period, rate_now);
    END IF;
    UPDATE pgq.queues AS s
    SET lease = coalesce(configure_queue.lease, s.lease),
        max_attempts = coalesce(configure_queue.max_attempts, s.max_attempts),
        backoff_base = coalesce(configure_queue.backoff_base, s.backoff_base),
        backoff_cap = coalesce(configure_queue.backoff_cap, s.backoff_cap),
        retention = coalesce(configure_queue.retention, s.retention),
        retention_failed = coalesce(configure_queue.retention_failed, s.retention_failed),
        retention_cancelled = coalesce(configure_queue.retention_cancelled, s.retention_cancelled),
        notify = coalesce(configure_queue.notify, s.notify),
        audit = coalesce(configure_queue.audit, s.audit),
        keep_done = coalesce(configure_queue.keep_done, s.keep_done),
        archive = coalesce(configure_queue.archive, s.archive),
        fair = coalesce(configure_queue.fair, s.fair),
        max_running = coalesce(configure_queue.max_running, s.max_running),
        max_run_time = CASE WHEN configure_queue.max_run_time IS NULL THEN s.max_run_time
                            WHEN configure_queue.max_run_time = interval '0' THEN NULL
                            ELSE configure_queue.max_run_time END,
        key_max_running = coalesce(configure_queue.key_max_running, s.key_max_running),
        key_sequence = CASE WHEN configure_queue.key_sequence IS NULL THEN s.key_sequence
                            ELSE nullif(configure_queue.key_sequence, 'off') END,
        key_limited = coalesce(configure_queue.key_max_running, s.key_max_running) > 0
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = configure_queue.queue)
                      OR CASE WHEN configure_queue.key_sequence IS NULL THEN s.key_sequence IS NOT NULL
                              ELSE configure_queue.key_sequence <> 'off' END,
        rate_limit = new_rate,
        rate_period = new_period,
        key_rate_limit = new_key_rate,
        rate_limited = new_rate > 0 OR new_key_rate > 0,
        max_wait = CASE WHEN configure_queue.max_wait IS NULL THEN s.max_wait
                        WHEN configure_queue.max_wait = interval '0' THEN NULL
                        ELSE configure_queue.max_wait END
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    q.rate_tat := pgq._bucket_full_at(q.name);
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer, interval, interval, boolean, interval, text, boolean) IS
    'Changes a queue''s settings (NULL leaves one unchanged; max_run_time ''0'' removes the limit, '
    'max_wait ''0'' restores strict priority, key_sequence ''off'' ends sequences) '
    'and returns them; creates the queue if new. retention_failed and retention_cancelled keep '
    'failed and cancelled jobs for another time than retention (never set: the queue''s retention); '
    'keep_done false deletes a job as it completes (default true: kept for retention); key_sequence '
    '''halt'' or ''continue'' runs the jobs of one concurrency_key one at a time in the order they were '
    'enqueued; archive true moves finished jobs, in the sweep, into pgq.archive, whose day '
    'partitions retention drops.';

-- Pausing or resuming a queue that does not exist is refused (22023): a typo creates nothing.
-- With `kind`, only that kind of the queue: pause adds it to the queue's paused_kinds (at most
-- 1000), resume takes it out (a kind that is not paused: nothing changes, the settings are
-- returned); claims that start after the call commits skip that kind of that queue (pgq.claim says
-- how, without reading its jobs). A kind that is not a name: 22023 naming `kind`, nothing written.
-- The queue's pause (kind NULL) and its paused kinds are apart: resuming the queue leaves its
-- paused kinds paused.
CREATE OR REPLACE FUNCTION pgq.pause(queue text, kind text DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', pause.queue);
BEGIN
    IF pause.kind IS NULL THEN
        PERFORM pgq._lock_queue(pause.queue);
        UPDATE pgq.queues AS s SET paused = true WHERE s.name = pause.queue RETURNING * INTO q;
        RETURN q;
    END IF;
    PERFORM pgq._check_name('kind', pause.kind);
    q := pgq._lock_queue(pause.queue);
    IF pause.kind = ANY (q.paused_kinds) THEN
        RETURN q;
    ELSIF cardinality(q.paused_kinds) >= 1000 THEN
        PERFORM pgq._bad_argument('kind', format('cannot be paused: queue %s has 1000 paused kinds', pause.queue),
            'Resume some of them first (pgq.resume(queue, kind => ...)), or pause the whole queue.');
    END IF;
    UPDATE pgq.queues AS s
    SET paused_kinds = ARRAY(SELECT k.kind FROM unnest(s.paused_kinds || pause.kind) AS k(kind) ORDER BY k.kind)
    WHERE s.name = pause.queue RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.pause(text, text) IS
    'Stops claims from the queue (running jobs go on), or with kind only of that kind of it; enqueue '
    'still works. Returns its settings; 22023 when there is no such queue or kind is not a name.';

CREATE OR REPLACE FUNCTION pgq.resume(queue text, kind text DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', resume.queue);
BEGIN
    IF resume.kind IS NULL THEN
        PERFORM pgq._lock_queue(resume.queue);
        UPDATE pgq.queues AS s SET paused = false WHERE s.name = resume.queue RETURNING * INTO q;
    ELSE
        PERFORM pgq._check_name('kind', resume.kind);
        q := pgq._lock_queue(resume.queue);
        IF NOT coalesce(resume.kind = ANY (q.paused_kinds), false) THEN
            RETURN q;  -- not paused: nothing to do
        END IF;
        UPDATE pgq.queues AS s
        SET paused_kinds = nullif(array_remove(s.paused_kinds, resume.kind), '{}')
        WHERE s.name = resume.queue RETURNING * INTO q;
    END IF;
    IF q.notify THEN
        PERFORM pg_notify('pgq', resume.queue);
    END IF;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.resume(text, text) IS
    'Lets workers claim from the queue again, or with kind claim that kind of it again (a kind that is '
    'not paused: nothing changes). Returns its settings; 22023 when there is no such queue or kind is '
    'not a name.';

-- Removes a queue that has nothing left in it: its settings row and its tenants. Refused with 55000
-- while the queue has jobs (of any state: cancel or finish the unfinished ones, pgq.prune the
-- finished ones) or schedules (pgq.unschedule them), and with 22023 when there is no such queue.
-- Race-free against enqueues: the queue's row, taken FOR UPDATE and held to commit, waits for the
-- enqueues in flight (each holds it FOR KEY SHARE: pgq._queue_to_write), so their jobs are seen
-- and refuse the drop, at most lock_timeout (5 s; then 55P03); an enqueue that comes later waits
-- for the drop (at most its 5 s), then creates the queue again with the defaults.
CREATE OR REPLACE FUNCTION pgq.drop_queue(queue text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', drop_queue.queue);
BEGIN
    q := pgq._lock_queue(drop_queue.queue, true);
    IF q.name IS NULL THEN
        PERFORM pgq._existing_queue('queue', drop_queue.queue);  -- dropped meanwhile: 22023
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = drop_queue.queue AND j.state <> 'running')
       OR EXISTS (SELECT FROM pgq.jobs AS j WHERE j.lease_until IS NOT NULL AND j.queue = drop_queue.queue) THEN
        RAISE EXCEPTION 'pgq: queue % still has jobs; only a queue without jobs can be dropped', drop_queue.queue
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Cancel its unfinished jobs or let them finish, then remove the finished ones with '
                         'pgq.prune(older_than => ''0'').';
    END IF;
    IF EXISTS (SELECT FROM pgq.schedules AS x WHERE x.queue = drop_queue.queue) THEN
        RAISE EXCEPTION 'pgq: queue % still has schedules; only a queue without schedules can be dropped',
            drop_queue.queue
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'pgq.schedules() lists them; pgq.unschedule(name) removes one.';
    END IF;
    DELETE FROM pgq.tenants AS t WHERE t.queue = drop_queue.queue;
    DELETE FROM pgq.archive_cursors AS c WHERE c.queue = drop_queue.queue;
    DELETE FROM pgq.queues AS s WHERE s.name = drop_queue.queue;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.drop_queue(text) IS
    'Removes a queue without jobs or schedules (its settings and tenants); 55000 while it has any, '
    '22023 when there is no such queue.';
