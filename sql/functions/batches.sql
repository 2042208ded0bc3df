-- sql/functions/batches.sql: batches: their members' counts and the one callback.

-- Whose a batch is (issue 37): the opener's. A batch id is a sequential number, no capability:
-- only the opener's login, and the members of the roles it names (pgq.batch_open(..., joiners)),
-- may add members (pgq._join_batch); to anyone else an enqueue naming the batch answers as for an
-- unknown id. Only the opener and admins read, close and cancel it (pgq._own_batch). Nobody else
-- can poison it (a member that waits for a failed job), delay it (a member due in years), fire it
-- early or hold its row.
--
-- How a batch is counted without a hot row (issue 26), and without waiting for a stranger:
--
-- * pgq.batch_open writes the batch row and 16 count shards (pgq.batch_counts). A member's enqueue
--   holds the batch row FOR SHARE (so pgq.batch_close, which updates it, waits for the enqueues in
--   flight and no member joins a sealed batch) and adds to one shard; a member's end (the trigger
--   jobs_ended: pgq._job_ended) adds to one shard and never locks the batch row before the tail
--   (the shards have no foreign key to the batch: a shard's second update in one transaction would
--   check it, FOR KEY SHARE on the batch row, a cost per member end and a wait behind a
--   batch_close). The shard is one the transaction holds already, else the first one from the
--   backend's own (pg_backend_pid() % 16) that no other transaction holds (SKIP LOCKED): members
--   of one batch end side by side. When all 16 are held (16 producers' open enqueues, say), the
--   add or the end counts into its backend's row of pgq.batch_backend_counts (keyed by its pid),
--   created then: no add and no end ever waits for a shard.
-- * Once the batch is sealed, a member's end checks how many are left: in the batch's tail (at most
--   pgq._batch_tail() members left, marked by the seal or by the first end that sums the shards
--   and finds so, on the batch row and on its shards: pgq._mark_tail) it locks the batch row, held
--   to its commit, and if every member added has ended and no callback is recorded, enqueues it
--   (pgq._finish_batch):
--   exactly once, since the callback's id is read and written under that lock. The lock makes the
--   last ends take turns: of two last ends in flight at once (each counted in its own shard, each
--   seeing the other's as not committed), the second to lock waits for the first's commit and then
--   sees its end, so the last one to commit enqueues the callback in its own transaction. An end
--   waits for the batch row at most 1 s (the ends before it commit in milliseconds; a cancel_batch
--   left open holds it longer), then leaves the callback to the sweep; an end inside a claim's or a
--   sweep's recovery of expired leases waits for it not at all.
--   pgq.batch_close locks the shards after sealing, so it waits for the ends in flight (which
--   did not see the seal) and then sees them; a backend's row created meanwhile missed the seal,
--   and its 32nd end reads the batch row to learn it. The rest (more than pgq._batch_tail() ends in
--   flight at once at the very end, an end that gave up its turn, an end in a backend's row created
--   during the seal) is settled by pgq.sweep (pgq._settle_batches: every sealed batch without a
--   callback, by batches_unsettled_idx). Never twice, never before the last member has ended.
-- * pgq.retry of a failed or cancelled member takes its end back (a shard's count goes down), so
--   its next end counts once. A member retried after the callback was enqueued changes the counts
--   pgq.batch_status shows, not the callback.
-- * pgq.cancel_batch seals the batch, marks it cancelled and cancels its members that have not
--   started, at most pgq._dependency_step() of them per call, walking pgq.batch_members from where
--   the last step stopped (batches.cancel_after); the sweep takes the next steps.
-- * The opener's and an admin's close and cancel wait for the batch's row and shards (enqueues and
--   ends in flight) at most their lock_timeout, 5 s, then 55P03 naming the batch.
-- Every function here runs as the owner; every name is schema-qualified. What they need passes as
-- arguments or in rows of pgq's tables, never in a session setting (which any caller can set).

-- The shard of `batch` this transaction counts into, locked (FOR NO KEY UPDATE), and whether the
-- transaction takes it now (first): one it holds already (its row's current version is this
-- transaction's, so that a transaction mostly holds one shard of a batch), else the first one from
-- the backend's own (pg_backend_pid() % 16) that no other transaction holds, else, when every one
-- is held, -1: the backend's row of pgq.batch_backend_counts (no other live backend has its pid),
-- created with the batch's sealed and tail as this statement reads them. Never waits.
CREATE OR REPLACE FUNCTION pgq._take_batch_shard(batch bigint, OUT shard integer, OUT first boolean)
    LANGUAGE plpgsql
    AS $$
DECLARE
    mine xid := pg_current_xact_id()::xid;
BEGIN
    SELECT c.shard, c.xmin IS DISTINCT FROM mine INTO shard, first
    FROM pgq.batch_counts AS c
    WHERE c.batch_id = _take_batch_shard.batch
    ORDER BY c.xmin = mine DESC, (c.shard - pg_backend_pid() % 16 + 16) % 16
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    shard := -1;
    SELECT c.xmin IS DISTINCT FROM mine INTO first FROM pgq.batch_backend_counts AS c
    WHERE c.batch_id = _take_batch_shard.batch AND c.backend = pg_backend_pid()
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        first := true;
        INSERT INTO pgq.batch_backend_counts AS c (batch_id, backend, sealed, tail)
        SELECT b.id, pg_backend_pid(), b.sealed_at IS NOT NULL, b.tail
        FROM pgq.batches AS b WHERE b.id = _take_batch_shard.batch;
    END IF;
END
$$;

-- Adds to this transaction's shard of `batch` (pgq._take_batch_shard's `shard`: -1 for its
-- backend's row) and returns the shard's sealed, tail and members ended (done, failed, cancelled).
CREATE OR REPLACE FUNCTION pgq._count_in_shard(batch bigint, shard integer, added bigint, done bigint,
                                               failed bigint, cancelled bigint,
                                               OUT sealed boolean, OUT tail boolean, OUT ended bigint)
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF _count_in_shard.shard >= 0 THEN
        UPDATE pgq.batch_counts AS c
        SET added = c.added + _count_in_shard.added, done = c.done + _count_in_shard.done,
            failed = c.failed + _count_in_shard.failed, cancelled = c.cancelled + _count_in_shard.cancelled
        WHERE c.batch_id = _count_in_shard.batch AND c.shard = _count_in_shard.shard
        RETURNING c.sealed, c.tail, c.done + c.failed + c.cancelled INTO sealed, tail, ended;
    ELSE
        UPDATE pgq.batch_backend_counts AS c
        SET added = c.added + _count_in_shard.added, done = c.done + _count_in_shard.done,
            failed = c.failed + _count_in_shard.failed, cancelled = c.cancelled + _count_in_shard.cancelled
        WHERE c.batch_id = _count_in_shard.batch AND c.backend = pg_backend_pid()
        RETURNING c.sealed, c.tail, c.done + c.failed + c.cancelled INTO sealed, tail, ended;
    END IF;
END
$$;

-- Marks this transaction's shard of `batch` (held: pgq._take_batch_shard) sealed, and in the tail
-- when `tail`.
CREATE OR REPLACE FUNCTION pgq._mark_own_shard(batch bigint, shard integer, tail boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF _mark_own_shard.shard >= 0 THEN
        UPDATE pgq.batch_counts AS c SET sealed = true, tail = c.tail OR _mark_own_shard.tail
        WHERE c.batch_id = _mark_own_shard.batch AND c.shard = _mark_own_shard.shard;
    ELSE
        UPDATE pgq.batch_backend_counts AS c SET sealed = true, tail = c.tail OR _mark_own_shard.tail
        WHERE c.batch_id = _mark_own_shard.batch AND c.backend = pg_backend_pid();
    END IF;
END
$$;

-- The name of the row of pgq.turns by which pgq.complete_many tells the trigger of its UPDATE (at
-- trigger depth `depth`, in this transaction) that it counts the batch members it completes itself,
-- once per batch (pgq._job_ended leaves them to it).
CREATE OR REPLACE FUNCTION pgq._batch_counting_mark(depth integer) RETURNS text
    LANGUAGE sql VOLATILE
    AS $$ SELECT 'count ' || pg_current_xact_id() || ' ' || $1 $$;

-- How many members may be left, as an end sees them, for the end to lock its batch's row (see
-- above): the ends that can be in flight at once (16 shard holders, a worker's transaction
-- carrying up to 64 completions), and no more: the ends that take turns hold the row through
-- their commits (a 100,000-member drain at W 16, fsync on: 0.87x the plain rate with 4,096,
-- 0.93x with 1,024).
-- (A constant in a function of its own: tests replace it.)
CREATE OR REPLACE FUNCTION pgq._batch_tail() RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 1024 $$;

-- The batch's counts: members added, those ended done, failed and cancelled, and those not ended
-- (sums of its shards and its backends' rows, as this statement sees them).
CREATE OR REPLACE FUNCTION pgq._batch_sums(batch bigint, OUT added bigint, OUT done bigint,
                                           OUT failed bigint, OUT cancelled bigint, OUT unfinished bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT x.added, x.done, x.failed, x.cancelled, x.added - x.done - x.failed - x.cancelled
    FROM (SELECT coalesce(sum(c.added), 0)::bigint AS added, coalesce(sum(c.done), 0)::bigint AS done,
                 coalesce(sum(c.failed), 0)::bigint AS failed, coalesce(sum(c.cancelled), 0)::bigint AS cancelled
          FROM (SELECT y.added, y.done, y.failed, y.cancelled FROM pgq.batch_counts AS y
                WHERE y.batch_id = _batch_sums.batch
                UNION ALL
                SELECT y.added, y.done, y.failed, y.cancelled FROM pgq.batch_backend_counts AS y
                WHERE y.batch_id = _batch_sums.batch) AS c) AS x
$$;

-- Whether the session's login may add members to the batch `batch` that `opened_by` opened: it is
-- that login, or a member of a role the opener named (pgq.batch_joiners; a dropped role matches
-- nobody).
CREATE OR REPLACE FUNCTION pgq._may_join(batch bigint, opened_by text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT $2 = session_user::text
        OR EXISTS (SELECT FROM pgq.batch_joiners AS j
                   WHERE j.batch_id = $1 AND pg_has_role(session_user, j.role, 'MEMBER'))
$$;

-- For pgq.enqueue and pgq.enqueue_many with `batch`, before they insert: the batch row, held FOR
-- SHARE to this transaction's end (pgq.batch_close waits for it). A batch the login may not join
-- (pgq._may_join) answers exactly as an unknown id: 22023 naming batch. 55000 for a sealed or
-- cancelled batch. A close or cancel in flight holds the row: waited for at most lock_timeout
-- (5 s), then 55P03 naming the batch.
CREATE OR REPLACE FUNCTION pgq._join_batch(batch bigint) RETURNS void
    LANGUAGE plpgsql
    SET lock_timeout = '5s'
    AS $$
DECLARE
    b pgq.batches;
BEGIN
    SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _join_batch.batch AND pgq._may_join(x.id, x.opened_by);
    IF FOUND AND b.sealed_at IS NULL THEN
        BEGIN
            SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _join_batch.batch FOR SHARE;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgq: batch % is being closed or cancelled by a transaction that has not ended; '
                            'gave up after lock_timeout %', _join_batch.batch, current_setting('lock_timeout')
                USING ERRCODE = 'lock_not_available',
                      HINT = 'Its opener''s pgq.batch_close or pgq.cancel_batch (or an admin''s) is in flight: '
                             'try again once it has ended.';
        END;
    END IF;
    IF b.id IS NULL THEN
        PERFORM pgq._bad_argument('batch', format('names no batch with id %s', _join_batch.batch),
            'A batch is opened by pgq.batch_open, which returns its id; members join it from its opener''s '
            'login and the logins it names (joiners).');
    ELSIF b.sealed_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgq: batch % is %, no member can join it', _join_batch.batch,
            CASE WHEN b.cancelled_at IS NOT NULL THEN 'cancelled' ELSE 'sealed' END
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Members join a batch between pgq.batch_open and pgq.batch_close (argument batch).';
    END IF;
END
$$;

-- For pgq.enqueue and pgq.enqueue_many: the jobs `ids` have joined `batch` (after pgq._join_batch).
CREATE OR REPLACE FUNCTION pgq._batch_added(batch bigint, ids bigint[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    mine integer;
BEGIN
    SELECT s.shard INTO mine FROM pgq._take_batch_shard(_batch_added.batch) AS s;
    INSERT INTO pgq.batch_members (batch_id, job_id) SELECT _batch_added.batch, i.id FROM unnest(ids) AS i(id);
    PERFORM pgq._count_in_shard(_batch_added.batch, mine, cardinality(_batch_added.ids), 0, 0, 0);
END
$$;

-- Called by pgq._job_ended when a member of `batch` ends `state` (by -1 from pgq.retry, which
-- takes an end back; by n from pgq.complete_many, which counts its completed members once per
-- batch, not one shard update per job; `recovering`: the end is a claim's or a sweep's recovery of
-- an expired lease): counts it in one shard (pgq._take_batch_shard, pgq._count_in_shard), whose
-- update also reads the batch's state as the shard holds it (sealed, tail: written by the seal
-- and by the tail's marking). An unsealed
-- batch's end stops there (but every 32nd end of a shard reads the batch row: a backend's row
-- created while the batch was sealed missed the seal). A sealed one's, in the tail, takes its turn
-- on the batch row and enqueues the callback when every member has ended (pgq._finish_batch).
-- Before the tail, the transaction's first end in the shard and every 32nd end of the shard read
-- the batch row: when the tail is marked there, the end marks its own shard (it holds it) and takes
-- its turn; else the 32nd sums the shards, and with at most pgq._batch_tail() members left takes its
-- turn, which marks the tail. So most ends cost one update of a row the transaction holds.
CREATE OR REPLACE FUNCTION pgq._batch_member_ended(batch bigint, state pgq.job_state, n integer DEFAULT 1,
                                                   recovering boolean DEFAULT false)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    mine     integer;
    first    boolean;
    sealed   boolean;
    tail     boolean;
    in_shard bigint;
    b        record;
    sums     record;
BEGIN
    SELECT s.shard, s.first INTO mine, first FROM pgq._take_batch_shard(_batch_member_ended.batch) AS s;
    SELECT c.sealed, c.tail, c.ended INTO sealed, tail, in_shard
    FROM pgq._count_in_shard(_batch_member_ended.batch, mine, 0,
                             CASE WHEN _batch_member_ended.state = 'done' THEN n ELSE 0 END,
                             CASE WHEN _batch_member_ended.state = 'failed' THEN n ELSE 0 END,
                             CASE WHEN _batch_member_ended.state = 'cancelled' THEN n ELSE 0 END) AS c;
    IF n <= 0 THEN
        RETURN;
    END IF;
    IF NOT sealed THEN
        IF in_shard / 32 = (in_shard - n) / 32
           OR NOT EXISTS (SELECT FROM pgq.batches AS x WHERE x.id = _batch_member_ended.batch AND x.sealed_at IS NOT NULL) THEN
            RETURN;
        END IF;
        PERFORM pgq._mark_own_shard(_batch_member_ended.batch, mine, false);
        first := true;  -- and its tail too may be stale: read the batch row below
    END IF;
    IF NOT tail THEN
        IF NOT first AND in_shard / 32 = (in_shard - n) / 32 THEN
            RETURN;  -- neither the transaction's first end in the shard nor a 32nd one
        END IF;
        SELECT x.tail, x.callback_job_id INTO b FROM pgq.batches AS x WHERE x.id = _batch_member_ended.batch;
        IF NOT FOUND OR b.callback_job_id IS NOT NULL THEN
            RETURN;
        END IF;
        IF b.tail THEN
            PERFORM pgq._mark_own_shard(_batch_member_ended.batch, mine, true);
        ELSIF in_shard / 32 = (in_shard - n) / 32 THEN
            RETURN;
        ELSE
            sums := pgq._batch_sums(_batch_member_ended.batch);
            IF sums.unfinished > pgq._batch_tail() THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Inside a claim's or a sweep's recovery of expired leases, a batch row another transaction
    -- holds is left to the sweep: a claim never waits.
    PERFORM pgq._finish_batch(_batch_member_ended.batch, recovering);
END
$$;

-- Marks the tail of the batch `batch` (its row held by the caller): on its row, and on every
-- shard no other transaction holds (those that one holds are marked by their next reader of the
-- row: pgq._batch_member_ended).
CREATE OR REPLACE FUNCTION pgq._mark_tail(batch bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE pgq.batches AS x SET tail = true WHERE x.id = _mark_tail.batch AND NOT x.tail;
    UPDATE pgq.batch_counts AS c SET tail = true
    WHERE c.batch_id = _mark_tail.batch
      AND c.shard = ANY (ARRAY(SELECT y.shard FROM pgq.batch_counts AS y
                               WHERE y.batch_id = _mark_tail.batch AND NOT y.tail
                               ORDER BY y.shard FOR NO KEY UPDATE SKIP LOCKED));
    UPDATE pgq.batch_backend_counts AS c SET tail = true
    WHERE c.batch_id = _mark_tail.batch
      AND c.backend = ANY (ARRAY(SELECT y.backend FROM pgq.batch_backend_counts AS y
                                 WHERE y.batch_id = _mark_tail.batch AND NOT y.tail
                                 ORDER BY y.backend FOR NO KEY UPDATE SKIP LOCKED));
END
$$;

-- Seals the batch `batch` (its row held by the caller): no member joins it after. Waits for the
-- adds and ends in flight (they hold their shards; they did not see the seal) at most the caller's
-- lock_timeout (then 55P03 naming the batch), marks the shards sealed, and marks the tail when few
-- members are left. For pgq.batch_close and pgq.cancel_batch.
CREATE OR REPLACE FUNCTION pgq._seal_batch(batch bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    sums record;
BEGIN
    UPDATE pgq.batches AS x SET sealed_at = coalesce(x.sealed_at, pgq._now()) WHERE x.id = _seal_batch.batch;
    BEGIN
        PERFORM FROM pgq.batch_counts AS c WHERE c.batch_id = _seal_batch.batch ORDER BY c.shard FOR NO KEY UPDATE;
        PERFORM FROM pgq.batch_backend_counts AS c WHERE c.batch_id = _seal_batch.batch
        ORDER BY c.backend FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: members of batch % are being added or ended by a transaction that has not ended; '
                        'gave up after lock_timeout %', _seal_batch.batch, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'An enqueue into it or an end of one of its members sits in an open transaction: '
                         'end it, and try again.';
    END;
    UPDATE pgq.batch_counts AS c SET sealed = true WHERE c.batch_id = _seal_batch.batch AND NOT c.sealed;
    UPDATE pgq.batch_backend_counts AS c SET sealed = true WHERE c.batch_id = _seal_batch.batch AND NOT c.sealed;
    sums := pgq._batch_sums(_seal_batch.batch);
    IF sums.unfinished <= pgq._batch_tail() THEN
        PERFORM pgq._mark_tail(_seal_batch.batch);
    END IF;
END
$$;

-- The batch row of `batch` for an end in its tail, locked FOR NO KEY UPDATE: waited for at most
-- 1 s (the ends before it, each holding it to its commit; a pgq.cancel_batch in flight), then the
-- end leaves the callback to the sweep (NULL). So does an end that would close a circle of waits
-- (one transaction ending members of two batches in their tails, another the same two in the
-- other order): the deadlock is the batch rows', not the worker's completion.
CREATE OR REPLACE FUNCTION pgq._batch_turn(batch bigint) RETURNS pgq.batches
    LANGUAGE plpgsql
    SET lock_timeout = '1s'
    AS $$
DECLARE
    b pgq.batches;
BEGIN
    SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _batch_turn.batch FOR NO KEY UPDATE;
    RETURN b;
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    RETURN NULL;
END
$$;

-- Enqueues the callback of the sealed batch `batch` if every member has ended and none is
-- recorded yet, under the batch row's lock (taken here: FOR NO KEY UPDATE, waited for at most 1 s
-- (pgq._batch_turn), or not at all when `skip`, when a batch row another transaction holds is left
-- for later). Returns whether it enqueued it.
-- The callback: the batch's callback queue, kind and payload, meta {"batch": {id, members, done,
-- failed, cancelled}}, enqueued by the batch's opener; cancelled at once (last_error says why)
-- when the batch was cancelled, or runs when all_done and a member failed or was cancelled. Its
-- queue's row is held FOR KEY SHARE as an enqueue holds it (pgq._queue_to_write), never waited
-- for: while a drop or a prune holds it, the callback is left for the sweep.
CREATE OR REPLACE FUNCTION pgq._finish_batch(batch bigint, skip boolean) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    b      pgq.batches;
    sums   record;
    q      pgq.queues;
    job_id bigint;
    why    text;
BEGIN
    IF skip THEN
        SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _finish_batch.batch FOR NO KEY UPDATE SKIP LOCKED;
    ELSE
        b := pgq._batch_turn(_finish_batch.batch);
    END IF;
    IF b.id IS NULL OR b.sealed_at IS NULL OR b.callback_job_id IS NOT NULL THEN
        RETURN false;
    END IF;
    sums := pgq._batch_sums(b.id);
    IF sums.unfinished > 0 THEN
        IF NOT b.tail AND sums.unfinished <= pgq._batch_tail() THEN
            PERFORM pgq._mark_tail(b.id);  -- from now on every end takes its turn
        END IF;
        RETURN false;
    END IF;
    IF b.cancelled_at IS NOT NULL THEN
        why := format('pgq: cancelled: its batch %s was cancelled', b.id);
    ELSIF b.run_when = 'all_done' AND sums.failed + sums.cancelled > 0 THEN
        why := format('pgq: cancelled: %s of the %s members of its batch %s failed and %s were cancelled '
                      '(run_when all_done)', sums.failed, sums.added, b.id, sums.cancelled);
    END IF;
    SELECT * INTO q FROM pgq.queues AS u WHERE u.name = b.callback_queue FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pgq.queues AS u WHERE u.name = b.callback_queue) THEN
            RETURN false;  -- a drop or a prune of the callback queue holds its row
        END IF;
        q := pgq._queue(b.callback_queue);  -- dropped since: created again, as an enqueue would
    END IF;
    IF q.fair AND pgq._fair_tenant(q.name, NULL, patient => false) IS NULL THEN
        RETURN false;  -- another transaction is registering the queue's tenant '': left to the sweep
    END IF;
    INSERT INTO pgq.jobs AS j (queue, kind, payload, max_attempts, tenant, meta, enqueued_by)
    VALUES (b.callback_queue, b.callback_kind, b.callback_payload, q.max_attempts,
            CASE WHEN q.fair THEN '' END,
            jsonb_build_object('batch', jsonb_build_object('id', b.id, 'members', sums.added, 'done', sums.done,
                                                           'failed', sums.failed, 'cancelled', sums.cancelled)),
            b.opened_by)
    RETURNING j.id INTO job_id;
    IF why IS NOT NULL THEN
        -- An update, not an insert in that state: the finished counters count it (their trigger).
        UPDATE pgq.jobs AS j
        SET state = 'cancelled', finished_at = pgq._now(), last_event = 'batch_ended', last_error = why
        WHERE j.id = job_id;
    ELSIF q.notify THEN
        PERFORM pg_notify('pgq', b.callback_queue);
    END IF;
    UPDATE pgq.batches AS x SET callback_job_id = job_id, finished_at = pgq._now() WHERE x.id = b.id;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq._finish_batch(bigint, boolean) IS
    'Enqueues a sealed batch''s callback once every member has ended and none is recorded yet.';

-- One step of a cancelled batch's cancellation: up to `max_members` of its members from
-- cancel_after on (pgq.batch_members, in id order), those not started (waiting or pending; one another
-- transaction holds is passed over) cancelled. Moves cancel_after on (NULL once past the last
-- member). The caller holds the batch row. Returns how many it cancelled.
CREATE OR REPLACE FUNCTION pgq._cancel_batch_step(batch bigint, max_members integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
DECLARE
    after   bigint := (SELECT b.cancel_after FROM pgq.batches AS b WHERE b.id = _cancel_batch_step.batch);
    seen    bigint[];
    gone    integer;
BEGIN
    IF after IS NULL THEN
        RETURN 0;
    END IF;
    seen := ARRAY(SELECT m.job_id FROM pgq.batch_members AS m
                  WHERE m.batch_id = _cancel_batch_step.batch AND m.job_id > after
                  ORDER BY m.batch_id, m.job_id LIMIT _cancel_batch_step.max_members);
    WITH doomed AS (
        SELECT j.id, j.state FROM pgq.jobs AS j
        WHERE j.id = ANY (seen) AND j.state IN ('waiting', 'pending')
        ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED
    ), cancelled AS (
        UPDATE pgq.jobs AS j
        SET state = 'cancelled', lease_until = NULL, finished_at = pgq._now(), last_event = 'cancelled',
            last_error = format('pgq: cancelled: its batch %s was cancelled', _cancel_batch_step.batch)
        FROM doomed AS d WHERE j.id = d.id AND j.state IN ('waiting', 'pending')
        RETURNING j.id, j.queue, j.attempt, j.last_error, d.state AS was
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT c.id, c.attempt, NULL, 'cancelled', c.was, 'cancelled', c.last_error
        FROM cancelled AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT count(*) INTO gone FROM cancelled;
    UPDATE pgq.batches AS b
    SET cancel_after = CASE WHEN cardinality(seen) < _cancel_batch_step.max_members THEN NULL
                            ELSE seen[cardinality(seen)] END
    WHERE b.id = _cancel_batch_step.batch;
    RETURN gone;
END
$$;

-- The sweep's part: the cancellations of cancelled batches, up to max_members members, and the
-- sealed batches without a callback whose members have all ended (ends that overlapped at the very
-- end), up to max_batches of them, oldest first; batch rows another transaction holds are left for
-- the next sweep. Returns how many callbacks it enqueued.
CREATE OR REPLACE FUNCTION pgq._settle_batches(max_batches integer, max_members integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    r        record;
    enqueued integer := 0;
    left_over integer := max_members;
BEGIN
    FOR r IN SELECT b.id FROM pgq.batches AS b WHERE b.cancel_after IS NOT NULL ORDER BY b.id LIMIT max_batches LOOP
        EXIT WHEN left_over <= 0;
        CONTINUE WHEN NOT EXISTS (SELECT FROM pgq.batches AS b WHERE b.id = r.id FOR NO KEY UPDATE SKIP LOCKED);
        left_over := left_over - pgq._cancel_batch_step(r.id, left_over);
    END LOOP;
    FOR r IN SELECT b.id FROM pgq.batches AS b WHERE b.sealed_at IS NOT NULL AND b.callback_job_id IS NULL
             ORDER BY b.id LIMIT max_batches LOOP
        IF pgq._finish_batch(r.id, true) THEN
            enqueued := enqueued + 1;
        END IF;
    END LOOP;
    RETURN enqueued;
END
$$;

-- The batch `id` for a call of its opener (or an admin): the row; P0002 for an unknown id or a
-- batch another login opened. With `lock`, the row is then locked FOR NO KEY UPDATE, waited for at
-- most the caller's lock_timeout (an enqueue into it, a close or a cancel, an end in its tail in
-- flight), then 55P03 naming the batch. (The check comes first: another login's call locks nothing.)
CREATE OR REPLACE FUNCTION pgq._own_batch(id bigint, lock boolean) RETURNS pgq.batches
    LANGUAGE plpgsql
    AS $$
DECLARE
    b pgq.batches;
BEGIN
    IF _own_batch.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _own_batch.id;
    IF NOT FOUND OR NOT (b.opened_by = session_user OR pg_has_role(session_user, 'pgq_admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'pgq: no batch with id %', _own_batch.id
            USING ERRCODE = 'no_data_found', HINT = 'A batch is seen by the login that opened it, and by admins.';
    END IF;
    IF lock THEN
        BEGIN
            SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _own_batch.id FOR NO KEY UPDATE;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgq: batch % is held by a transaction that has not ended; gave up after lock_timeout %',
                _own_batch.id, current_setting('lock_timeout')
                USING ERRCODE = 'lock_not_available',
                      HINT = 'An enqueue into it (or a close or cancel of it) sits in an open transaction: end it, '
                             'and try again.';
        END;
    END IF;
    RETURN b;
END
$$;

-- pgq.batch_open's joiners: the oids of those roles; 22023 naming the argument for a NULL element,
-- more than 100, or a name that is no role.
CREATE OR REPLACE FUNCTION pgq._joiner_roles(joiners text[]) RETURNS oid[]
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    roles   oid[];
    missing text;
BEGIN
    IF array_position(joiners, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('joiners', 'must not contain NULL');
    ELSIF cardinality(joiners) > 100 THEN
        PERFORM pgq._bad_argument('joiners', format('names %s roles; at most 100', cardinality(joiners)),
            'Name a group role and grant it to the logins instead.');
    END IF;
    SELECT j.name INTO missing FROM unnest(joiners) AS j(name)
    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = j.name) LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._bad_argument('joiners', format('names no role: %s', left(quote_literal(missing), 80)),
            'Name the logins (or a group role of them) that may add members, as in pg_roles.');
    END IF;
    SELECT array_agg(DISTINCT r.oid ORDER BY r.oid) INTO roles
    FROM pg_catalog.pg_roles AS r WHERE r.rolname = ANY (joiners);
    RETURN roles;
END
$$;

CREATE OR REPLACE FUNCTION pgq.batch_open(callback_queue text, callback_kind text,
                                          callback_payload jsonb DEFAULT '{}', run_when text DEFAULT 'all_ended',
                                          joiners text[] DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q      pgq.queues;
    roles  oid[];
    new_id bigint;
BEGIN
    PERFORM pgq._check_name('callback_queue', batch_open.callback_queue);
    PERFORM pgq._check_name('callback_kind', batch_open.callback_kind);
    PERFORM pgq._check_payload('callback_payload', batch_open.callback_payload);
    IF batch_open.run_when IS NULL OR batch_open.run_when NOT IN ('all_ended', 'all_done') THEN
        PERFORM pgq._bad_argument('run_when', format('must be ''all_ended'' or ''all_done'', got %s',
                                                     coalesce(quote_literal(batch_open.run_when), 'NULL')));
    END IF;
    IF batch_open.joiners IS NOT NULL THEN
        roles := pgq._joiner_roles(batch_open.joiners);
    END IF;
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = batch_open.callback_queue;
    IF FOUND AND q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    INSERT INTO pgq.batches AS b (opened_by, callback_queue, callback_kind, callback_payload, run_when)
    VALUES (session_user, batch_open.callback_queue, batch_open.callback_kind, batch_open.callback_payload,
            batch_open.run_when)
    RETURNING b.id INTO new_id;
    INSERT INTO pgq.batch_counts (batch_id, shard) SELECT new_id, s FROM generate_series(0, 15) AS s;
    INSERT INTO pgq.batch_joiners (batch_id, role) SELECT new_id, r.role FROM unnest(roles) AS r(role);
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.batch_open(text, text, jsonb, text, text[]) IS
    'Opens a batch and returns its id: members join it by enqueue(..., batch => id) from the opener''s '
    'login and the roles named in joiners; once it is sealed (pgq.batch_close) and its last member has '
    'ended, one callback job is enqueued.';

CREATE OR REPLACE FUNCTION pgq.batch_close(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    b pgq.batches := pgq._own_batch(batch_close.id, false);
BEGIN
    IF b.sealed_at IS NOT NULL THEN
        RETURN false;  -- (without locking it: a close left open holds no sealed batch's row)
    END IF;
    b := pgq._own_batch(batch_close.id, true);
    IF b.sealed_at IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pgq._seal_batch(b.id);
    PERFORM pgq._finish_batch(b.id, false);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.batch_close(bigint) IS
    'Seals a batch (no member joins it after): true when this call sealed it, false when it was sealed; '
    'an empty batch''s callback is enqueued at once. P0002: unknown, or another login''s; 55P03 after '
    'waiting 5 s for enqueues into it or ends of its members in open transactions.';

-- The batch `id` as the caller may see it: the login that opened it, monitors and admins; 22004
-- when id is NULL, P0002 for anyone else, as for an unknown id (pgq.batch_status, pgq.batch_jobs).
CREATE OR REPLACE FUNCTION pgq._visible_batch(id bigint) RETURNS pgq.batches
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    b pgq.batches;
BEGIN
    IF _visible_batch.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO b FROM pgq.batches AS x WHERE x.id = _visible_batch.id;
    IF NOT FOUND OR NOT (b.opened_by = session_user OR pg_has_role(session_user, 'pgq_monitor', 'MEMBER')
                         OR pg_has_role(session_user, 'pgq_admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'pgq: no batch with id %', _visible_batch.id
            USING ERRCODE = 'no_data_found',
                  HINT = 'A batch is seen by the login that opened it, by monitors and by admins.';
    END IF;
    RETURN b;
END
$$;

CREATE OR REPLACE FUNCTION pgq.batch_status(id bigint)
    RETURNS TABLE (batch_id bigint, state text, opened_by text, callback_queue text, callback_kind text,
                   run_when text, members bigint, unfinished bigint, done bigint, failed bigint,
                   cancelled bigint, callback_job_id bigint, created_at timestamptz, sealed_at timestamptz,
                   finished_at timestamptz)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    b    pgq.batches;
    sums record;
BEGIN
    b := pgq._visible_batch(batch_status.id);
    sums := pgq._batch_sums(b.id);
    RETURN QUERY SELECT b.id,
        CASE WHEN b.cancelled_at IS NOT NULL THEN 'cancelled' WHEN b.callback_job_id IS NOT NULL THEN 'finished'
             WHEN b.sealed_at IS NOT NULL THEN 'sealed' ELSE 'open' END,
        b.opened_by, b.callback_queue, b.callback_kind, b.run_when, sums.added,
        greatest(sums.unfinished, 0), sums.done, sums.failed, sums.cancelled,
        b.callback_job_id, b.created_at, b.sealed_at, b.finished_at;
END
$$;
COMMENT ON FUNCTION pgq.batch_status(bigint) IS
    'A batch''s state (open, sealed, finished, cancelled), its members'' counts by state and its callback '
    'job once enqueued. P0002 for logins other than its opener, monitors and admins.';

CREATE OR REPLACE FUNCTION pgq.cancel_batch(id bigint)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    b    pgq.batches := pgq._own_batch(cancel_batch.id, true);
    gone integer := 0;
BEGIN
    IF b.cancelled_at IS NULL THEN
        UPDATE pgq.batches AS x SET cancelled_at = pgq._now(), cancel_after = 0 WHERE x.id = b.id;
        IF b.sealed_at IS NULL THEN
            PERFORM pgq._seal_batch(b.id);  -- (a sealed batch's ends in flight saw the seal already)
        END IF;
    END IF;
    gone := pgq._cancel_batch_step(b.id, pgq._dependency_step());
    -- A callback enqueued already and not started is cancelled too.
    IF b.callback_job_id IS NOT NULL THEN
        UPDATE pgq.jobs AS j
        SET state = 'cancelled', finished_at = pgq._now(), last_event = 'cancelled',
            last_error = format('pgq: cancelled: its batch %s was cancelled', b.id)
        WHERE j.id = b.callback_job_id AND j.state IN ('waiting', 'pending');
    END IF;
    PERFORM pgq._finish_batch(b.id, false);
    RETURN gone;
END
$$;
COMMENT ON FUNCTION pgq.cancel_batch(bigint) IS
    'Cancels a batch: seals it, cancels up to 1000 of its members that have not started (returns how many; '
    'pgq.sweep cancels the rest) and its callback. P0002: unknown, or another login''s; 55P03 after '
    'waiting 5 s for enqueues into it or ends of its members in open transactions.';
