-- sql/functions/fence.sql: the failover fence: attempt numbers moved past a promotion.

-- The timeline this primary writes WAL on: the first 8 hex digits of its current WAL file's name.
-- It changes the moment a standby is promoted (or a backup is restored to a point in time);
-- pg_control_checkpoint()'s timeline only at the next checkpoint.
CREATE OR REPLACE FUNCTION pgq._timeline() RETURNS integer
    LANGUAGE sql VOLATILE
    AS $$ SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer $$;

-- How many attempt numbers a fence move skips per timeline: more than any one job can have been
-- given by a primary after its last WAL that reached the standby. Each attempt a primary hands
-- out costs at least two commits of the job's row (the claim and the outcome, ~0.5 kB of WAL
-- together), so 100000 attempts of one job are ~50 MB of WAL that never reached the standby;
-- Patroni refuses to promote a replica that lags more than maximum_lag_on_failover (1 MB by
-- default). With integer attempts, a job can be moved ~21000 times.
CREATE OR REPLACE FUNCTION pgq._fence_step() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 100000 $$;

-- The slow path of the fence check in pgq.claim, when the fence row names another timeline than
-- this server's (it was promoted, or restored): moves the fences now. In one
-- transaction that locks the fence row (so concurrent first claims take turns, and the later
-- ones find the work done), every job that is not done gets attempt_skip raised by
-- _fence_step() per timeline passed: its next claim issues attempt + 1 + attempt_skip, and
-- max_attempts rises by the same amount (the attempts left stay the same), so no number the
-- old primary handed out is issued again. A job running here keeps its attempt: this server's
-- record of it is the claim that handed that number out, once, to the owner that holds it.
-- Done jobs are final and never claimed again; failed and cancelled ones may be retried, so
-- they are moved too.
CREATE OR REPLACE FUNCTION pgq._check_timeline() RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    current_timeline integer;
    fenced pgq.fence;
    step bigint;
    moved bigint;
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgq: this server is a standby (in recovery): jobs are claimed on the primary'
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Connect to the primary, e.g. with target_session_attrs=read-write in a multi-host DSN.';
    END IF;
    current_timeline := pgq._timeline();
    SELECT * INTO fenced FROM pgq.fence AS f;
    IF fenced.timeline IS DISTINCT FROM current_timeline THEN
        SELECT * INTO fenced FROM pgq.fence AS f FOR UPDATE;
        IF fenced.timeline IS DISTINCT FROM current_timeline THEN
            -- Timelines only grow along a server's history; a lower one (a dump restored into
            -- another cluster, say) still moves the fences once.
            step := pgq._fence_step()::bigint * greatest(1, current_timeline - fenced.timeline);
            WITH doomed AS (
                SELECT j.id FROM pgq.jobs AS j WHERE j.state <> 'done' ORDER BY j.id FOR NO KEY UPDATE
            ), skipped AS (
                UPDATE pgq.jobs AS j SET attempt_skip = j.attempt_skip + step
                FROM doomed AS d WHERE j.id = d.id
                RETURNING j.id, j.queue, j.attempt, j.state
            ), events AS (
                INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
                SELECT s.id, s.attempt, NULL, 'fenced', s.state, s.state,
                       format('timeline %s -> %s: the next claim skips %s attempt numbers',
                              fenced.timeline, current_timeline, step)
                FROM skipped AS s JOIN pgq.queues AS q ON q.name = s.queue AND q.audit
            )
            SELECT count(*) INTO moved FROM skipped;
            -- (An upsert: were the row ever deleted, the next session would otherwise move again.)
            INSERT INTO pgq.fence AS f (timeline, moves, moved_at, jobs_moved)
            VALUES (current_timeline, 1, now(), moved)
            ON CONFLICT (one) DO UPDATE
            SET timeline = excluded.timeline, moves = f.moves + 1, moved_at = excluded.moved_at,
                jobs_moved = excluded.jobs_moved;
            RAISE LOG 'pgq: timeline % -> %: fences of % unfinished jobs moved by % attempts',
                fenced.timeline, current_timeline, moved, step;
        END IF;
    END IF;
END
$$;
