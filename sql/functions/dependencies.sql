-- sql/functions/dependencies.sql: waiting jobs and their release or cancellation.

-- How dependencies hold without a lock on anybody's job (issue 24; before, an enqueue locked and
-- flagged the jobs it named until it committed, which stalled their owners and hid them from claims):
--
-- * An enqueue with depends_on reads the states of the jobs it names (pgq._read_dependencies) and
--   locks none of them: their owners renew, complete and fail as if it were not there, claims
--   return them, admin calls find them unlocked. The new job waits (state 'waiting',
--   dependencies_left) for those not done yet, linked to each (pgq.job_dependencies), and leaves a
--   check per such dependency (pgq.overlap_checks; pgq._wait_for_dependencies).
-- * Every end of a job (the trigger jobs_ended, pgq._job_ended) looks up whether
--   jobs wait for it, in the statement that counts the end (one probe of job_dependencies' primary
--   key), and only then moves them on (pgq._dependency_ended): done, each waiting dependant counts
--   one dependency fewer and the one at 0 becomes pending; failed or cancelled, they are cancelled,
--   and the jobs waiting for them down the chain.
-- * An end and an enqueue in flight at once do not see each other, and neither waits for the
--   other: the end does not see the new links, the enqueue reads the dependency as not ended. The
--   enqueue's checks settle it (pgq._settle_checks, in every pgq.settle_dependencies, which a
--   worker calls every poll, and every sweep): a check is taken once its enqueue has committed; if
--   the dependency has ended by then, its dependants move on then; if no end of it is in flight,
--   its end is sure to see the links (it looks them up after it has locked the row, and they were
--   committed before), and the check goes; if one is, the check waits for the next call. So a
--   dependant moves on in the ending transaction when its enqueue committed before the end looked,
--   and by the first such call after both committed when they overlapped; never early (only an
--   end that has committed is seen). An end at REPEATABLE READ or SERIALIZABLE
--   whose snapshot is older than its statement leaves a check for itself (that snapshot may not
--   see links committed since).
-- * The work one call does is bounded, its plan independent of statistics: the ends of one
--   transaction move on at most pgq._dependency_step() dependants (a cancelled one counts the
--   links its cancellation deletes), the first in id order, then their dependants breadth first;
--   the rest goes to pgq.cascade_backlog, which every sweep and settle works through, max_jobs
--   dependants at a time, shared fairly among the logins whose work its rows are (pgq._work_backlog;
--   the checks too, pgq._take_checks), so that one login's fan-out or flood of checks never holds
--   another's release back past the next call. The per-transaction bounds are kept where only the
--   owner writes (pgq.cascade_budgets, below), never in a setting the caller could set. The ends of
--   a claim's or a sweep's recovery of expired leases move none at all (a claim never works for,
--   nor waits on, the dependency graph). Every statement reads by primary key or
--   job_dependencies_job_idx in index order, with sequential and bitmap scans and hash and merge
--   joins disabled (the SET clauses): a bitmap scan of a fan-out's 100,000 links, sorted to take
--   the first 1000, is what statistics that say "few" would otherwise choose.
-- * A dependant's row is updated by each of its dependencies' ends, and they take turns on it (so
--   the count is exact: each decrement reads the newest row version). An owner's or admin's end
--   waits for a dependant's row that another transaction holds (say, the completion of another part
--   of a fan-in) at most 50 ms in all, per transaction, polling; past that, and always in a sweep
--   or settle, a row held elsewhere is left to the backlog.
-- * pgq.retry may bring an ended job back: the dependants of its earlier end (ids below that end's
--   backlog rows' below_id) stay that end's, and its next end moves on only those enqueued after.
-- Every function here runs as the owner (like pgq._job_ended: every name schema-qualified).

-- How many dependants the ends of one transaction move on, at most; the rest goes to the backlog.
-- (A constant in a function of its own: tests replace it.)
CREATE OR REPLACE FUNCTION pgq._dependency_step() RETURNS integer
    LANGUAGE sql STABLE
    AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION pgq._dependency_step() IS
    'How many dependants the ends of one transaction move on at most (the rest: pgq.cascade_backlog).';

-- The id the next job will get: every job enqueued after this call has an id at least this.
CREATE OR REPLACE FUNCTION pgq._next_job_id() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$ SELECT coalesce(pg_catalog.pg_sequence_last_value('pgq.jobs_id_seq'::regclass), 0) + 1 $$;

-- A transaction's cascade state is a row of pgq.cascade_budgets keyed by its id: how many
-- dependants its ends have left to move on, until when they may wait for a dependant's row, whether
-- they are a recovery's. Only these functions write it, as the owner: no setting or temporary table
-- of the caller's reaches it (the session settings pgq.dependency_budget and pgq.dependency_patience
-- once carried it, and any caller could set them: a worker that set its budget to 0 left every
-- dependant its ends released, other logins' too, to the sweep). No row: nothing spent, no wait
-- begun, no recovery. Only a transaction whose ends move dependants on, wait for one, or that
-- recovers leases writes one (an end of a job nothing waits for reads nothing here);
-- pgq._forget_cascades deletes the rows of ended transactions. A savepoint rolled back takes its
-- writes to the row back with the work they counted.

-- How many dependants this transaction's ends may still move on: pgq._dependency_step() less what
-- they have moved on; 0 while it recovers expired leases.
CREATE OR REPLACE FUNCTION pgq._dependency_budget() RETURNS integer
    LANGUAGE sql VOLATILE
    AS $$
    SELECT coalesce((SELECT CASE WHEN b.recovering THEN 0 ELSE least(b.budget, pgq._dependency_step()) END
                     FROM pgq.cascade_budgets AS b WHERE b.xid = pg_current_xact_id()),
                    pgq._dependency_step())
$$;

-- Counts `used` more dependants moved on by this transaction's ends.
CREATE OR REPLACE FUNCTION pgq._spend_budget(used integer) RETURNS void
    LANGUAGE sql VOLATILE
    AS $$
    INSERT INTO pgq.cascade_budgets AS b (xid, budget)
    VALUES (pg_current_xact_id(), greatest(pgq._dependency_step() - _spend_budget.used, 0))
    ON CONFLICT ON CONSTRAINT cascade_budgets_pkey
    DO UPDATE SET budget = greatest(b.budget - _spend_budget.used, 0)
$$;

-- Until when this transaction's ends may still wait for dependants' rows that other transactions
-- hold: 50 ms after the first such wait.
CREATE OR REPLACE FUNCTION pgq._patience() RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    until timestamptz := (SELECT b.patience FROM pgq.cascade_budgets AS b WHERE b.xid = pg_current_xact_id());
BEGIN
    IF until IS NULL THEN
        until := clock_timestamp() + interval '50 milliseconds';
        INSERT INTO pgq.cascade_budgets AS b (xid, budget, patience)
        VALUES (pg_current_xact_id(), pgq._dependency_step(), until)
        ON CONFLICT ON CONSTRAINT cascade_budgets_pkey DO UPDATE SET patience = excluded.patience;
    END IF;
    RETURN until;
END
$$;

-- Marks this transaction as recovering expired leases (pgq._recover_expired), or no longer: its
-- ends meanwhile move no dependant on (they go to the backlog) and wait for no batch row.
CREATE OR REPLACE FUNCTION pgq._set_recovering(recovering boolean) RETURNS void
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    IF _set_recovering.recovering THEN
        INSERT INTO pgq.cascade_budgets AS b (xid, budget, recovering)
        VALUES (pg_current_xact_id(), pgq._dependency_step(), true)
        ON CONFLICT ON CONSTRAINT cascade_budgets_pkey DO UPDATE SET recovering = true;
    ELSE
        UPDATE pgq.cascade_budgets AS b SET recovering = false WHERE b.xid = pg_current_xact_id();
    END IF;
END
$$;

-- Deletes up to max_rows rows of pgq.cascade_budgets whose transactions have ended (ids below the
-- oldest one still running), never waiting for another call deleting them. Returns how many.
CREATE OR REPLACE FUNCTION pgq._forget_cascades(max_rows integer) RETURNS integer
    LANGUAGE sql VOLATILE
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
    WITH gone AS (
        DELETE FROM pgq.cascade_budgets AS b
        WHERE b.xid = ANY (ARRAY(SELECT x.xid FROM pgq.cascade_budgets AS x
                                 WHERE x.xid < pg_snapshot_xmin(pg_current_snapshot())
                                 ORDER BY x.xid LIMIT _forget_cascades.max_rows FOR UPDATE SKIP LOCKED))
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

-- Called by pgq._job_ended when a job ends that jobs wait for (waited_for), that waited
-- itself, or whose end reads an older snapshot than its statement. A waiting job that ends (it is
-- cancelled) deletes its own links; an end under an older snapshot leaves a check for itself; then
-- the jobs waiting for this one move on, up to this transaction's budget (none inside a claim's or
-- a sweep's recovery), the rest going to the backlog. A job that a cascade step cancelled
-- (cascaded: last_event dependency_ended) leaves its dependants to that step.
CREATE OR REPLACE FUNCTION pgq._dependency_ended(ended_id bigint, old_state pgq.job_state, new_state pgq.job_state,
                                                 waited_for boolean, cascaded boolean) RETURNS void
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    used integer;
BEGIN
    IF old_state = 'waiting' THEN
        DELETE FROM pgq.job_dependencies AS d WHERE d.job_id = ended_id;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed'
       AND transaction_timestamp() <> statement_timestamp() THEN
        INSERT INTO pgq.overlap_checks (job_id, login) VALUES (ended_id, session_user);
    END IF;
    IF NOT waited_for OR cascaded THEN
        RETURN;
    END IF;
    used := pgq._move_dependants_on(ended_id, new_state, pgq._dependency_budget());
    IF used > 0 THEN
        PERFORM pgq._spend_budget(used);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq._dependency_ended(bigint, pgq.job_state, pgq.job_state, boolean, boolean) IS
    'Called by pgq._job_ended when a job that jobs wait for, or that waited, ends: releases (done) '
    'or cancels (failed, cancelled) its waiting dependants, up to the transaction''s budget.';

-- The dependants of `ended_id`, which has just ended `ended`, moved on by this transaction (at most
-- `budget`, breadth first down a cancelled chain: pgq._dependency_work), and what is left put in
-- the backlog, in order. Those of an earlier end of the same job (before a pgq.retry of it) are
-- left to that end's backlog rows. Returns how much of the budget it used.
CREATE OR REPLACE FUNCTION pgq._move_dependants_on(ended_id bigint, ended pgq.job_state, budget integer)
    RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    below   bigint := pgq._next_job_id();
    from_id bigint := coalesce((SELECT max(b.below_id) FROM pgq.cascade_backlog AS b
                                WHERE b.job_id = _move_dependants_on.ended_id), 0);
    todo    bigint[] := ARRAY[ended_id];      -- ended jobs whose dependants move on, in order
    froms   bigint[] := ARRAY[from_id];
    states  pgq.job_state[] := ARRAY[ended];
    open    boolean[] := ARRAY[true];         -- whether each still has dependants to move on
    left_over integer := budget;
    step    record;
    i       integer := 1;
BEGIN
    WHILE i <= cardinality(todo) AND left_over > 0 LOOP
        step := pgq._dependency_work(todo[i], states[i], froms[i], below, ended_id, ended, left_over, true);
        left_over := left_over - step.used;
        open[i] := step.more;
        -- Those of its dependants it cancelled that have dependants of their own, at the end.
        todo := todo || step.cancelled;
        froms := froms || array_fill(0::bigint, ARRAY[cardinality(step.cancelled)]);
        states := states || array_fill('cancelled'::pgq.job_state, ARRAY[cardinality(step.cancelled)]);
        open := open || array_fill(true, ARRAY[cardinality(step.cancelled)]);
        i := i + 1;
    END LOOP;
    -- What is left goes to the sweep, in order, each row the work of the login that enqueued its
    -- next dependant.
    INSERT INTO pgq.cascade_backlog (job_id, ended, from_id, below_id, root_id, root_state, login)
    SELECT t.id, t.state, t.from_id, below, _move_dependants_on.ended_id, _move_dependants_on.ended,
           pgq._next_dependant_login(t.id, t.from_id, below)
    FROM unnest(todo, states, froms, open) WITH ORDINALITY AS t(id, state, from_id, more, n)
    WHERE t.more
    ORDER BY t.n;
    RETURN budget - left_over;
END
$$;

-- The login that enqueued the first job still waiting for `ended_id` with an id in [from_id,
-- below_id) ('' when none, or enqueued before 0017): whose work a backlog row of it is.
CREATE OR REPLACE FUNCTION pgq._next_dependant_login(ended_id bigint, from_id bigint, below_id bigint)
    RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((SELECT j.enqueued_by FROM pgq.jobs AS j
                     WHERE j.id = (SELECT d.job_id FROM pgq.job_dependencies AS d
                                   WHERE d.depends_on = _next_dependant_login.ended_id
                                     AND (d.depends_on, d.job_id) >= (_next_dependant_login.ended_id,
                                                                      _next_dependant_login.from_id)
                                     AND (d.depends_on, d.job_id) < (_next_dependant_login.ended_id,
                                                                     _next_dependant_login.below_id)
                                   ORDER BY d.depends_on, d.job_id LIMIT 1)), '')
$$;

-- One step for the ended job `ended_id` (ended `ended`; it, or the job up its chain whose end
-- cancelled it, is root_id, ended root_state): its waiting dependants with ids in [from_id,
-- below_id), in id order, as many as `budget` allows (a release counts one, a cancellation the
-- links it deletes: all of the dependant's own; at least one dependant). Each is locked first; one
-- that another transaction holds is skipped (left for later) unless `patient`, when it is waited
-- for until pgq._patience(), by polling. Done: each counts one dependency fewer, and the one at 0
-- becomes pending (its queue notified when it is due). Failed or cancelled: each that waits by
-- all_done is cancelled with last_error naming the dependency (and the root, further down a
-- chain; its trigger deletes its links), each that waits by all_ended counts it as a done one. Returns the budget used, whether dependants in the range are left (more), and those it
-- cancelled that have dependants of their own, in id order (cancelled).
CREATE OR REPLACE FUNCTION pgq._dependency_work(ended_id bigint, ended pgq.job_state, from_id bigint,
                                                below_id bigint, root_id bigint, root_state pgq.job_state,
                                                budget integer, patient boolean,
                                                OUT used integer, OUT more boolean, OUT cancelled bigint[])
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    candidates bigint[];  -- the first links' dependants, in id order
    locked     bigint[];  -- those this step holds
    picked     bigint[];  -- those it moves on (within the budget)
    waiting    bigint[];  -- of those, the ones still waiting that it releases (or counts down)
    doomed     bigint[];  -- and those still waiting that it cancels (all_done, and the end was no success)
    unlinked   bigint[];  -- the picked ones whose link this step deleted
    due_queues text[];
    patience   timestamptz;
BEGIN
    used := 0;
    cancelled := '{}';
    -- The links by primary key alone (the row comparisons fit no other index), in index order.
    candidates := ARRAY(SELECT d.job_id FROM pgq.job_dependencies AS d
                        WHERE d.depends_on = _dependency_work.ended_id
                          AND (d.depends_on, d.job_id) >= (_dependency_work.ended_id, _dependency_work.from_id)
                          AND (d.depends_on, d.job_id) < (_dependency_work.ended_id, _dependency_work.below_id)
                        ORDER BY d.depends_on, d.job_id
                        LIMIT _dependency_work.budget);
    IF cardinality(candidates) = 0 THEN
        more := false;
        RETURN;
    END IF;
    locked := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (candidates) ORDER BY j.id
                    FOR NO KEY UPDATE SKIP LOCKED);
    IF patient AND cardinality(locked) < cardinality(candidates) THEN
        patience := pgq._patience();
        WHILE cardinality(locked) < cardinality(candidates) AND clock_timestamp() < patience LOOP
            PERFORM pg_sleep(0.001);
            locked := locked || ARRAY(SELECT j.id FROM pgq.jobs AS j
                                      WHERE j.id = ANY (candidates) AND j.id <> ALL (locked)
                                      ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED);
        END LOOP;
    END IF;
    -- The newest versions of the rows it holds (this statement's snapshot is newer than the locks):
    -- as many as the budget allows, a release counting one, a cancellation the links it deletes (all
    -- the dependant's own), at least one. Read by id here, so that the writes below name only ids.
    -- A dependant moves on by its own rule: one that waits for every dependency to be done is
    -- cancelled by a failed or cancelled one; one that waits for every one to end (all_ended)
    -- counts it as it counts a done one.
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}'),
           coalesce(array_agg(c.id ORDER BY c.id) FILTER (WHERE c.state = 'waiting' AND c.releases), '{}'),
           coalesce(array_agg(c.id ORDER BY c.id) FILTER (WHERE c.state = 'waiting' AND NOT c.releases), '{}'),
           coalesce(max(c.total), 0)::integer
    INTO picked, waiting, doomed, used
    FROM (SELECT j.id, j.state, r.releases,
                 sum(CASE WHEN r.releases OR j.state <> 'waiting' THEN 1
                          ELSE greatest(j.dependencies_left, 1) END) OVER (ORDER BY j.id) AS total,
                 row_number() OVER (ORDER BY j.id) AS n
          FROM pgq.jobs AS j
          CROSS JOIN LATERAL (SELECT _dependency_work.ended = 'done'
                                     OR j.dependency_mode IS NOT DISTINCT FROM 'all_ended' AS releases) AS r
          WHERE j.id = ANY (locked)) AS c
    WHERE c.total <= _dependency_work.budget OR c.n = 1;
    -- Each moves on only if this statement deletes its link to the ended job: a sweep that took
    -- the row after another one had moved it on (both read the link before either committed) finds
    -- no link and does nothing. (A link to a job that no longer waits goes too; there is none.)
    -- One array per id condition: two on one column made the index scan take their product.
    WITH gone AS (
        DELETE FROM pgq.job_dependencies AS d
        WHERE d.depends_on = _dependency_work.ended_id AND d.job_id = ANY (picked)
          AND (d.depends_on, d.job_id) >= (_dependency_work.ended_id, picked[1])
          AND (d.depends_on, d.job_id) <= (_dependency_work.ended_id, picked[cardinality(picked)])
        RETURNING d.job_id
    )
    SELECT coalesce(array_agg(g.job_id), '{}') INTO unlinked FROM gone AS g;
    IF cardinality(waiting) > 0 THEN
        WITH released AS (
            UPDATE pgq.jobs AS j
            SET dependencies_left = j.dependencies_left - 1,
                state = CASE WHEN j.dependencies_left = 1 THEN 'pending' ELSE 'waiting' END::pgq.job_state,
                last_event = CASE WHEN j.dependencies_left = 1 THEN 'dependencies_done' ELSE j.last_event END
            WHERE j.id = ANY (ARRAY(SELECT u.id FROM unnest(unlinked) AS u(id) WHERE u.id = ANY (waiting)))
            RETURNING j.id, j.queue, j.attempt, j.state, j.run_at
        ), events AS (
            INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
            SELECT r.id, r.attempt, NULL, 'dependencies_done', 'waiting', 'pending',
                   CASE WHEN _dependency_work.ended = 'done'
                        THEN format('the last of its dependencies, job %s, is done', _dependency_work.ended_id)
                        ELSE format('the last of its dependencies, job %s, has ended %s (all_ended)',
                                    _dependency_work.ended_id, _dependency_work.ended) END
            FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
            WHERE r.state = 'pending'
        )
        SELECT array_agg(DISTINCT r.queue) INTO due_queues
        FROM released AS r WHERE r.state = 'pending' AND r.run_at <= pgq._now();
        PERFORM pgq._notify(n.queue) FROM unnest(due_queues) AS n(queue);
    END IF;
    IF cardinality(doomed) > 0 THEN
        WITH gone AS (
            UPDATE pgq.jobs AS j
            SET state = 'cancelled', finished_at = pgq._now(), last_event = 'dependency_ended',
                last_error = CASE WHEN _dependency_work.ended_id = _dependency_work.root_id
                                  THEN format('pgq: cancelled: its dependency, job %s, ended %s',
                                              _dependency_work.ended_id, _dependency_work.ended)
                                  ELSE format('pgq: cancelled: its dependency, job %s, was cancelled because job %s, '
                                              'up its chain, ended %s', _dependency_work.ended_id,
                                              _dependency_work.root_id, _dependency_work.root_state) END
            WHERE j.id = ANY (ARRAY(SELECT u.id FROM unnest(unlinked) AS u(id) WHERE u.id = ANY (doomed)))
            RETURNING j.id, j.queue, j.attempt, j.last_error
        ), events AS (
            INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
            SELECT c.id, c.attempt, NULL, 'dependency_ended', 'waiting', 'cancelled', c.last_error
            FROM gone AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
        )
        SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO cancelled FROM gone AS c;
        -- Their triggers have deleted their own links; those that jobs wait for go on down the chain.
        -- (One probe each: a LATERAL subquery with LIMIT, which the planner cannot turn into a join
        -- over every link, as it did an EXISTS once the statistics said the links had one dependency.)
        cancelled := ARRAY(SELECT c.id FROM unnest(cancelled) AS c(id)
                           CROSS JOIN LATERAL (SELECT FROM pgq.job_dependencies AS d WHERE d.depends_on = c.id
                                               LIMIT 1) AS x
                           ORDER BY c.id);
    END IF;
    more := EXISTS (SELECT FROM pgq.job_dependencies AS d
                    WHERE d.depends_on = _dependency_work.ended_id
                      AND (d.depends_on, d.job_id) >= (_dependency_work.ended_id, _dependency_work.from_id)
                      AND (d.depends_on, d.job_id) < (_dependency_work.ended_id, _dependency_work.below_id));
END
$$;

-- Moves up to max_rows rows of each table of before 0021 (pgq.dependency_checks,
-- pgq.dependency_backlog, pgq.unique_successors), rows that were held while 0021 ran or that the
-- previous release's functions wrote until this source was installed, to the tables that replaced
-- them (pgq.overlap_checks, pgq.cascade_backlog, pgq.replace_slots), in order, never waiting: a
-- check or backlog row as nobody's work (''), a successor slot as its job's login's (one whose job
-- is gone or was enqueued before 0017 goes). Nothing else writes the old tables; a later migration
-- drops them. For pgq.sweep.
CREATE OR REPLACE FUNCTION pgq._adopt_legacy(max_rows integer) RETURNS void
    LANGUAGE sql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
    WITH gone AS (
        DELETE FROM pgq.dependency_checks AS c
        WHERE c.id = ANY (ARRAY(SELECT x.id FROM pgq.dependency_checks AS x ORDER BY x.id
                                LIMIT _adopt_legacy.max_rows FOR UPDATE SKIP LOCKED))
        RETURNING c.id, c.job_id
    )
    INSERT INTO pgq.overlap_checks (job_id, login) SELECT g.job_id, '' FROM gone AS g ORDER BY g.id;
    WITH gone AS (
        DELETE FROM pgq.dependency_backlog AS b
        WHERE b.id = ANY (ARRAY(SELECT x.id FROM pgq.dependency_backlog AS x ORDER BY x.id
                                LIMIT _adopt_legacy.max_rows FOR UPDATE SKIP LOCKED))
        RETURNING b.*
    )
    INSERT INTO pgq.cascade_backlog (job_id, ended, from_id, below_id, root_id, root_state, login)
    SELECT g.job_id, g.ended, g.from_id, g.below_id, g.root_id, g.root_state, '' FROM gone AS g ORDER BY g.id;
    WITH gone AS (
        DELETE FROM pgq.unique_successors AS s
        WHERE (s.queue, s.unique_key) IN (SELECT x.queue, x.unique_key FROM pgq.unique_successors AS x
                                          LIMIT _adopt_legacy.max_rows FOR UPDATE SKIP LOCKED)
        RETURNING s.queue, s.unique_key, s.job_id
    )
    INSERT INTO pgq.replace_slots (queue, unique_key, enqueued_by, job_id)
    SELECT g.queue, g.unique_key, j.enqueued_by, g.job_id
    FROM gone AS g JOIN pgq.jobs AS j ON j.id = g.job_id
    WHERE j.enqueued_by IS NOT NULL
    ON CONFLICT ON CONSTRAINT replace_slots_pkey DO NOTHING;
$$;

-- Up to `most` logins that have rows in pgq.overlap_checks (`checks`) or pgq.cascade_backlog,
-- in name order from one picked by the clock on, wrapping round: when more logins have work than
-- one call serves, each call starts elsewhere (and none is left out for good). One index probe a
-- login (idx (login, id)).
CREATE OR REPLACE FUNCTION pgq._logins_with_work(checks boolean, most integer) RETURNS text[]
    LANGUAGE plpgsql VOLATILE
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
DECLARE
    start  text := chr(48 + (extract(microseconds FROM clock_timestamp())::integer % 75));
    logins text[] := '{}';
    cur    text;
BEGIN
    FOR lap IN 1..2 LOOP  -- from start on, then from the first up to start
        cur := NULL;
        LOOP
            EXIT WHEN cardinality(logins) >= _logins_with_work.most;
            IF cur IS NULL THEN
                cur := CASE WHEN _logins_with_work.checks
                            THEN (SELECT c.login FROM pgq.overlap_checks AS c
                                  WHERE c.login >= CASE WHEN lap = 1 THEN start ELSE '' END
                                  ORDER BY c.login LIMIT 1)
                            ELSE (SELECT b.login FROM pgq.cascade_backlog AS b
                                  WHERE b.login >= CASE WHEN lap = 1 THEN start ELSE '' END
                                  ORDER BY b.login LIMIT 1) END;
            ELSE
                cur := CASE WHEN _logins_with_work.checks
                            THEN (SELECT c.login FROM pgq.overlap_checks AS c WHERE c.login > cur
                                  ORDER BY c.login LIMIT 1)
                            ELSE (SELECT b.login FROM pgq.cascade_backlog AS b WHERE b.login > cur
                                  ORDER BY b.login LIMIT 1) END;
            END IF;
            EXIT WHEN cur IS NULL OR lap = 2 AND cur >= start;
            logins := logins || cur;
        END LOOP;
    END LOOP;
    RETURN logins;
END
$$;

-- The sweep's step through the backlog, shared fairly among the logins whose work it holds (the
-- `login` of its rows): each login first gets an equal share of max_dependants for its rows, oldest
-- first; what the shares leave goes to the rows oldest first, whoever's. So one login's fan-out of
-- any size never holds another login's rows back past the next call. A row moves on as many
-- dependants as are left of its share (pgq._dependency_work, never waiting: a dependant another
-- transaction holds, or a row another sweep is working on, is left for a later call). The jobs a row
-- cancels that have dependants of their own join the backlog at its end, as its login's work
-- (and the same pass goes on with them); a row with nothing left goes. Returns how many dependants
-- it moved on.
CREATE OR REPLACE FUNCTION pgq._work_backlog(max_dependants integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    logins    text[] := pgq._logins_with_work(false, max_dependants);
    left_over integer := max_dependants;
    moved     integer := 0;
    share     integer;
    step      record;
BEGIN
    IF cardinality(logins) = 0 THEN
        RETURN 0;
    END IF;
    share := greatest(max_dependants / cardinality(logins), 1);
    FOR i IN 1..cardinality(logins) + 1 LOOP
        EXIT WHEN left_over <= 0;
        -- Each login its share, then (i past the last) every login's rows with the rest.
        step := pgq._work_backlog_rows(CASE WHEN i <= cardinality(logins) THEN logins[i] END,
                                       CASE WHEN i <= cardinality(logins) THEN least(share, left_over)
                                            ELSE left_over END);
        left_over := left_over - step.charged;
        moved := moved + step.moved;
    END LOOP;
    RETURN moved;
END
$$;

-- pgq._work_backlog's pass over the rows of one login (NULL: everyone's), oldest first, within
-- `budget`: how many dependants it moved on, and how much of the budget that was (a row that moved
-- none and is kept, its dependants held elsewhere, counts one; a row found empty is deleted and
-- counts nothing, and a pass visits at most ten rows per dependant of its budget).
CREATE OR REPLACE FUNCTION pgq._work_backlog_rows(who text, budget integer, OUT moved integer,
                                                  OUT charged integer)
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    r      pgq.cascade_backlog;
    step   record;
    after  bigint := 0;
    below  bigint := pgq._next_job_id();
    visits integer := 0;
BEGIN
    moved := 0;
    charged := 0;
    WHILE charged < budget AND visits < 10 * budget LOOP
        visits := visits + 1;
        IF who IS NULL THEN
            SELECT * INTO r FROM pgq.cascade_backlog AS b WHERE b.id > after ORDER BY b.id LIMIT 1
            FOR UPDATE SKIP LOCKED;
        ELSE
            SELECT * INTO r FROM pgq.cascade_backlog AS b WHERE b.login = who AND b.id > after
            ORDER BY b.login, b.id LIMIT 1
            FOR UPDATE SKIP LOCKED;
        END IF;
        EXIT WHEN NOT FOUND;
        after := r.id;
        step := pgq._dependency_work(r.job_id, r.ended, r.from_id, r.below_id, r.root_id, r.root_state,
                                     budget - charged, false);
        moved := moved + step.used;
        charged := charged + CASE WHEN step.used = 0 AND step.more THEN 1 ELSE step.used END;
        INSERT INTO pgq.cascade_backlog (job_id, ended, from_id, below_id, root_id, root_state, login)
        SELECT c.id, 'cancelled', 0, below, r.root_id, r.root_state, r.login
        FROM unnest(step.cancelled) WITH ORDINALITY AS c(id, n) ORDER BY c.n;
        IF NOT step.more THEN
            DELETE FROM pgq.cascade_backlog AS b WHERE b.id = r.id;
        END IF;
    END LOOP;
END
$$;

-- Takes (locks) up to max_checks checks that no other call holds, fairly among the logins that
-- left them: each login its oldest, an equal share of what is left, in rounds (a login with fewer
-- leaves its share to the others), at most three rounds. Returns their ids.
CREATE OR REPLACE FUNCTION pgq._take_checks(max_checks integer) RETURNS bigint[]
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
DECLARE
    logins   text[] := pgq._logins_with_work(true, max_checks);
    lasts    bigint[] := array_fill(0::bigint, ARRAY[cardinality(logins)]);
    more     text[];      -- the logins that took their whole share: they may have more
    mores    bigint[];    -- and the last check each took
    taken    bigint[] := '{}';
    got      bigint[];
    left_over integer := max_checks;
    share    integer;
BEGIN
    FOR round IN 1..3 LOOP
        EXIT WHEN left_over <= 0 OR cardinality(logins) = 0;
        share := greatest(left_over / cardinality(logins), 1);
        more := '{}';
        mores := '{}';
        FOR i IN 1..cardinality(logins) LOOP
            EXIT WHEN left_over <= 0;
            got := ARRAY(SELECT c.id FROM pgq.overlap_checks AS c
                         WHERE c.login = logins[i] AND c.id > lasts[i]
                         ORDER BY c.login, c.id LIMIT least(share, left_over)
                         FOR UPDATE SKIP LOCKED);
            taken := taken || got;
            IF cardinality(got) = least(share, left_over) THEN
                more := more || logins[i];
                mores := mores || got[cardinality(got)];
            END IF;
            left_over := left_over - cardinality(got);
        END LOOP;
        logins := more;
        lasts := mores;
    END LOOP;
    RETURN taken;
END
$$;

-- The sweep's step through the checks (pgq.overlap_checks, left by enqueues with depends_on and
-- by ends under older snapshots): up to max_checks, fairly among logins (pgq._take_checks), each
-- taken once its writer has committed (a row another call holds is skipped). Its dependency has
-- ended (or is gone): the jobs still linked to it move on as after a fresh end of it (a backlog
-- row, root itself, the work of the check's login). It has not: when no transaction holds its
-- row, any end of it will see the links (it looks them up after locking the row), and the check
-- goes; when one does (its end may be in flight), the check goes to the back, for the next call.
-- "Holds" is read from the row's xmax (never set on a version no transaction has locked or
-- updated), and where that is set, by locking the rows with SKIP LOCKED in a subtransaction that
-- is then rolled back (the locks go with it; a job so held for that moment is skipped by a claim,
-- or waited for by its owner, for the moment only). Returns how many it settled.
CREATE OR REPLACE FUNCTION pgq._settle_checks(max_checks integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    AS $$
DECLARE
    check_ids  bigint[];
    dep_ids    bigint[];
    dep_states pgq.job_state[];
    touched    boolean[];
    logins     text[];    -- whose each check is
    ended_ids  bigint[] := '{}';
    ended_states pgq.job_state[] := '{}';
    ended_logins text[] := '{}';
    suspects   bigint[] := '{}';  -- not ended, and a transaction has locked the row since it was written
    suspect_logins text[] := '{}';
    got_ids    bigint[] := '{}';
    got_states pgq.job_state[] := '{}';
    busy       bigint[] := '{}';  -- where in suspects those another transaction holds are
BEGIN
    SELECT coalesce(array_agg(p.id ORDER BY p.id), '{}'), array_agg(p.job_id ORDER BY p.id),
           array_agg(j.state ORDER BY p.id), array_agg(NOT (j.xmax = '0'::xid) ORDER BY p.id),
           array_agg(p.login ORDER BY p.id)
    INTO check_ids, dep_ids, dep_states, touched, logins
    FROM (SELECT c.id, c.job_id, c.login FROM unnest(pgq._take_checks(max_checks)) AS t(id)
          JOIN pgq.overlap_checks AS c ON c.id = t.id) AS p
    LEFT JOIN LATERAL (SELECT x.state, x.xmax FROM pgq.jobs AS x WHERE x.id = p.job_id) AS j ON true;
    IF cardinality(check_ids) = 0 THEN
        RETURN 0;
    END IF;
    FOR i IN 1..cardinality(check_ids) LOOP
        IF dep_states[i] IS NULL OR dep_states[i] IN ('done', 'failed', 'cancelled') THEN
            ended_ids := ended_ids || dep_ids[i];
            ended_states := ended_states || coalesce(dep_states[i], 'cancelled');
            ended_logins := ended_logins || logins[i];
        ELSIF touched[i] AND NOT dep_ids[i] = ANY (suspects) THEN
            suspects := suspects || dep_ids[i];
            suspect_logins := suspect_logins || logins[i];
        END IF;
    END LOOP;
    IF cardinality(suspects) > 0 THEN
        BEGIN
            -- The newest row versions: an end committed since this function's first statement is read.
            SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.state), '{}')
            INTO got_ids, got_states
            FROM (SELECT j.id, j.state FROM pgq.jobs AS j WHERE j.id = ANY (suspects) ORDER BY j.id
                  FOR NO KEY UPDATE SKIP LOCKED) AS x;
            RAISE EXCEPTION 'pgq: the locks are taken back' USING ERRCODE = 'PGQ24';
        EXCEPTION WHEN SQLSTATE 'PGQ24' THEN
            NULL;
        END;
        FOR i IN 1..cardinality(got_ids) LOOP
            IF got_states[i] IN ('done', 'failed', 'cancelled') THEN
                ended_ids := ended_ids || got_ids[i];
                ended_states := ended_states || got_states[i];
                ended_logins := ended_logins || suspect_logins[array_position(suspects, got_ids[i])];
            END IF;
        END LOOP;
        busy := ARRAY(SELECT s.n FROM unnest(suspects) WITH ORDINALITY AS s(id, n) WHERE s.id <> ALL (got_ids)
                      ORDER BY s.id);
    END IF;
    -- Ended with jobs still linked to it: they move on as after a fresh end (those of an earlier end
    -- before a retry are left to its rows), the work of the login of (the first) check of it.
    INSERT INTO pgq.cascade_backlog (job_id, ended, from_id, below_id, root_id, root_state, login)
    SELECT e.id, e.state,
           coalesce((SELECT max(b.below_id) FROM pgq.cascade_backlog AS b WHERE b.job_id = e.id), 0),
           pgq._next_job_id(), e.id, e.state, e.login
    FROM (SELECT DISTINCT ON (u.id) u.id, u.state, u.login
          FROM unnest(ended_ids, ended_states, ended_logins) WITH ORDINALITY AS u(id, state, login, n)
          ORDER BY u.id, u.n) AS e
    CROSS JOIN LATERAL (SELECT FROM pgq.job_dependencies AS d WHERE d.depends_on = e.id LIMIT 1) AS x
    ORDER BY e.id;
    DELETE FROM pgq.overlap_checks AS c WHERE c.id = ANY (check_ids);
    INSERT INTO pgq.overlap_checks (job_id, login)
    SELECT suspects[b.n], suspect_logins[b.n] FROM unnest(busy) AS b(n);
    RETURN cardinality(check_ids) - cardinality(busy);
END
$$;

-- The dependencies of a job being enqueued (pgq.enqueue's and pgq.enqueue_many's depends_on),
-- checked and read, not locked. A job of a queue whose read grants do not admit the login counts as
-- absent, exactly as an unknown id (like in pgq.get_job). Returns the distinct ids in order, those
-- not ended yet (the new job waits for them) and, by the rule `mode` 'all_done', the first that
-- ended failed or cancelled (the new job is then cancelled at once), with its state ('all_ended':
-- none; such a dependency has ended, which is all the new job waits for).
CREATE OR REPLACE FUNCTION pgq._read_dependencies(depends_on bigint[], mode text, OUT ids bigint[],
                                                  OUT open_ids bigint[], OUT ended_id bigint,
                                                  OUT ended_state pgq.job_state)
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    SET lock_timeout = '5s'
    AS $$
DECLARE
    missing bigint;
    held    bigint[];  -- those not ended of queues that delete done jobs (keep_done false)
BEGIN
    IF array_ndims(_read_dependencies.depends_on) > 1 THEN
        PERFORM pgq._bad_argument('depends_on', 'must be a one-dimensional array of job ids');
    ELSIF array_position(_read_dependencies.depends_on, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', 'must not contain NULL');
    END IF;
    ids := ARRAY(SELECT DISTINCT d.id FROM unnest(_read_dependencies.depends_on) AS d(id) ORDER BY d.id);
    IF cardinality(ids) > 10000 THEN
        PERFORM pgq._bad_argument('depends_on', format('must name at most 10000 jobs, got %s', cardinality(ids)),
            'A job that waits for more: enqueue it after an intermediate job that waits for the rest.');
    END IF;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    WITH seen AS (
        SELECT j.id, j.state, q.keep_done FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue
        WHERE j.id = ANY (ids) AND (q.restricted IS NULL OR pgq._may(q.name, q.restricted, 'read'))
    )
    SELECT (SELECT min(i.id) FROM unnest(ids) AS i(id) WHERE i.id NOT IN (SELECT s.id FROM seen AS s)),
           ARRAY(SELECT s.id FROM seen AS s WHERE s.state NOT IN ('done', 'failed', 'cancelled') ORDER BY s.id),
           (SELECT s.id FROM seen AS s WHERE s.state IN ('failed', 'cancelled') AND mode = 'all_done'
            ORDER BY s.id LIMIT 1),
           (SELECT s.state FROM seen AS s WHERE s.state IN ('failed', 'cancelled') AND mode = 'all_done'
            ORDER BY s.id LIMIT 1),
           ARRAY(SELECT s.id FROM seen AS s WHERE NOT s.keep_done AND s.state NOT IN ('done', 'failed', 'cancelled')
                 ORDER BY s.id)
    INTO missing, open_ids, ended_id, ended_state, held;
    -- A job of a keep_done false queue is deleted as it completes, unless jobs depend on it: one
    -- this enqueue reads not ended is held FOR KEY SHARE to its commit, so that a completion that
    -- cannot see the new links yet keeps it (pgq._drop_completed skips it) and the check finds it
    -- done. The lock conflicts with nothing but a delete (and FOR UPDATE): owners, claims and admin
    -- calls write the row as before. It waits only for a completion that is deleting it, at most
    -- lock_timeout (5 s); a job deleted meanwhile is missing, as one deleted before the read.
    IF missing IS NULL AND cardinality(held) > 0 THEN
        SELECT min(h.id) INTO missing FROM unnest(held) AS h(id)
        WHERE h.id NOT IN (SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (held) ORDER BY j.id FOR KEY SHARE OF j);
    END IF;
    IF missing IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', format('names no job with id %s', missing),
            'A job that never existed, or a finished one that pgq.prune has deleted (after its queue''s '
            'retention) or its queue deleted as it completed (keep_done false), cannot be depended on.');
    END IF;
END
$$;
COMMENT ON FUNCTION pgq._read_dependencies(bigint[], text) IS
    'For pgq.enqueue''s depends_on: checks and reads the dependencies (locking none); returns them, those '
    'not ended yet and (dependency_mode all_done) the first that ended failed or cancelled.';

-- The jobs `ids`, just enqueued waiting, with pgq._read_dependencies' answer for their
-- dependencies: linked to the open ones (pgq.job_dependencies), each of which gets a check (an end
-- of it in flight now cannot see these links: pgq._settle_checks), or, when one had ended failed or
-- cancelled (ended_id), cancelled at once, as if they had been waiting then. For pgq.enqueue and
-- pgq.enqueue_many.
CREATE OR REPLACE FUNCTION pgq._wait_for_dependencies(ids bigint[], open_ids bigint[], ended_id bigint,
                                                      ended_state pgq.job_state)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF _wait_for_dependencies.ended_id IS NOT NULL THEN
        PERFORM pgq._cancel_for_dependency(_wait_for_dependencies.ids, _wait_for_dependencies.ended_id,
                                           _wait_for_dependencies.ended_state);
    ELSE
        INSERT INTO pgq.job_dependencies (depends_on, job_id)
        SELECT d.id, n.id
        FROM unnest(_wait_for_dependencies.open_ids) AS d(id) CROSS JOIN unnest(_wait_for_dependencies.ids) AS n(id);
        INSERT INTO pgq.overlap_checks (job_id, login)
        SELECT d.id, session_user FROM unnest(_wait_for_dependencies.open_ids) AS d(id);
    END IF;
END
$$;

-- Cancels a waiting job whose dependency `dependency` has ended `ended` (failed or cancelled):
-- for pgq.enqueue and pgq.enqueue_many, when a dependency had ended before the job was enqueued
-- (pgq._dependency_ended cancels the jobs already waiting).
CREATE OR REPLACE FUNCTION pgq._cancel_for_dependency(ids bigint[], dependency bigint, ended pgq.job_state)
    RETURNS void
    LANGUAGE sql
    AS $$
    WITH cancelled AS (
        UPDATE pgq.jobs AS j
        SET state = 'cancelled', finished_at = pgq._now(), last_event = 'dependency_ended',
            last_error = format('pgq: cancelled: its dependency, job %s, ended %s', dependency, ended)
        WHERE j.id = ANY (ids) AND j.state = 'waiting'
        RETURNING j.id, j.queue, j.attempt, j.last_error
    )
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT c.id, c.attempt, NULL, 'dependency_ended', 'waiting', 'cancelled', c.last_error
    FROM cancelled AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
$$;
COMMENT ON FUNCTION pgq._cancel_for_dependency(bigint[], bigint, pgq.job_state) IS
    'Cancels waiting jobs whose dependency has ended failed or cancelled, with last_error naming it.';
