-- sql/functions/recovery.sql: expired leases: their recovery, and pgq.sweep.

-- Recovers running jobs whose lease has expired: back to pending at once (the attempt they used
-- is counted), or to failed when that was the last attempt. An attempt whose lease reached its
-- deadline (claim and renew never lease past it) has timed out instead: it ends as a failure
-- (event timed_out, last_error 'timed out after <max_run_time>'), retried after the queue's
-- backoff while attempts remain, failed otherwise. The candidates are locked with their
-- expiry re-checked on the newest row version (FOR NO KEY UPDATE re-evaluates the WHERE clause of
-- a row changed after the statement's snapshot); the UPDATE re-checks, on the row it holds, that
-- the same attempt is still running, so a job completed or re-claimed meanwhile is never touched.
-- The UPDATE's re-check deliberately names no lease_until condition: one would let the planner
-- drive the UPDATE from jobs_lease_idx instead of the locked ids, and with statistics that say
-- few jobs are running it did, reading every expired lease once per recovered job (1.5 s for a
-- sweep(1000) over 2,850 expired leases, growing with their square).
-- The ends of a recovery move no dependant on (the transaction is marked recovering meanwhile, in
-- its cascade state, pgq._set_recovering: its dependency budget is 0 and they go to
-- pgq.cascade_backlog): a claim never works for, nor waits on, the dependency graph, and the
-- sweep's backlog step takes them after its recovery.
-- The leases read are those that passed since `lease_floor` (a claim's: it read its probe from the
-- lease floor up, and so does its recovery) or all of them ('-infinity': the sweep's and the
-- minute's look at the leases below the floor).
CREATE OR REPLACE FUNCTION pgq._recover_expired(max_jobs integer, lease_floor timestamptz)
    RETURNS TABLE (queue text, recovered bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    -- The oldest leases in jobs_lease_idx's order, stopping at max_jobs: with the range's bounds
    -- unknown to the generic plan, a bitmap scan of the whole range and a sort looked cheaper
    -- (tests/sql/test_sql_plans.py).
    SET enable_bitmapscan = off
    AS $$
BEGIN
    PERFORM pgq._set_recovering(true);
    RETURN QUERY
    WITH expired AS (
        SELECT j.id, j.attempt
        FROM pgq.jobs AS j
        WHERE j.state = 'running' AND j.lease_until >= _recover_expired.lease_floor AND j.lease_until < pgq._now()
        ORDER BY j.lease_until
        LIMIT _recover_expired.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), recovered AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'pending' END::pgq.job_state,
            lease_until = NULL,
            finished_at = CASE WHEN j.attempt >= j.max_attempts THEN pgq._now() END,
            run_at = CASE WHEN j.lease_until >= j.deadline AND j.attempt < j.max_attempts
                          THEN pgq._now() + pgq._backoff(j.attempt - j.attempt_offset, q.backoff_base, q.backoff_cap)
                          ELSE j.run_at END,
            last_event = CASE WHEN j.lease_until >= j.deadline THEN 'timed_out' ELSE 'lease_expired' END,
            last_error = CASE WHEN j.lease_until >= j.deadline
                              THEN format('timed out after %s', j.deadline - j.claimed_at)
                              ELSE format('lease expired at %s (attempt %s, worker %s)',
                                          j.lease_until, j.attempt, j.claimed_by) END
        FROM expired AS e, pgq.queues AS q
        WHERE j.id = e.id AND j.state = 'running' AND j.attempt = e.attempt AND q.name = j.queue
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.state, j.last_event, j.last_error, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT r.id, r.attempt, r.claimed_by, r.last_event, 'running', r.state,
               CASE WHEN r.last_event = 'timed_out' THEN r.last_error ELSE 'recovered' END
        FROM recovered AS r
        WHERE r.audit
    )
    SELECT r.queue, count(*) FROM recovered AS r GROUP BY r.queue;
    PERFORM pgq._set_recovering(false);
END
$$;

-- THE LEASE FLOOR. A claim's expired-lease probe (pgq._claim_queues) reads jobs_lease_idx from
-- the floor up, not from its lowest entry: while a snapshot is held vacuum removes nothing, and
-- every finished job's old running version keeps its entry there, below the live leases, so a
-- probe from the bottom read more of them with every minute of the snapshot. The floor
-- (pgq.lease_floor, microseconds since the epoch) is a time below which no running job's lease
-- ended, as far as the claims that raised it saw: a claim whose probe found no lease passed between
-- the floor and its own clock (pgq._now()), read in a snapshot taken after that clock, raises the
-- floor to that clock, at most once a second (so the probe reads at most about a second of
-- finished jobs' entries). A lease that commits before it ends never lies below the floor: a floor
-- is the clock of a probe that did not see the lease, so it came before that probe's snapshot,
-- before the lease's commit and before its end. The exceptions are leases that were past already
-- when they became visible: a claim or renewal that committed after its own lease had passed
-- (commit claims promptly), or a lease moved into the past by hand. Those are recovered by
-- the next pgq.sweep (whose recovery reads every expired lease) or, once a minute, by the claim
-- that raises the floor (pgq.lease_floor_checked), so that even without sweeps no job stays
-- running past its lease for longer than that. A floor ahead of this server's clock (the clock went
-- back, or a failover to a server behind) counts as the clock (the probe's bound is the earlier): it reads
-- nothing, the next raise sets the floor back to the clock, and a lease that passed below it is
-- left to the minute's recovery and the sweep, as above.

-- Raises the lease floor to this claim's clock (pgq.claim calls it when its probe found no lease
-- passed since the floor, in READ COMMITTED, and the floor is a second old or more); once a minute
-- it first recovers the expired leases below the floor too (see above). setval takes no lock:
-- claims raising it at once never wait for each other (the last one's clock stays: any of them is
-- a true floor).
CREATE OR REPLACE FUNCTION pgq._raise_lease_floor() RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    now_micros bigint := pgq._micros(pgq._now());
BEGIN
    IF coalesce(pg_sequence_last_value('pgq.lease_floor_checked'), 0) <= now_micros - 60000000 THEN
        PERFORM setval('pgq.lease_floor_checked', now_micros);
        IF EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()) THEN
            PERFORM pgq._recover_expired(100, '-infinity');  -- (only then: a recovery writes its cascade state)
        END IF;
    END IF;
    PERFORM setval('pgq.lease_floor', now_micros);
    -- The claim floors' flag (claim.sql) back to 0 once no process recorded floors for 2 seconds:
    -- claims then stop looking for theirs. (One that records floors meanwhile sets it again, at
    -- the latest by its next pick that reads far.)
    IF pg_sequence_last_value('pgq.claim_floors_set') BETWEEN 1 AND now_micros - 2000000 THEN
        PERFORM setval('pgq.claim_floors_set', 0);
    END IF;
END
$$;

-- pgq.sweep's and pgq.settle_dependencies' max_jobs: 1 to 100000 (22004 / 22023 otherwise).
CREATE OR REPLACE FUNCTION pgq._check_max_jobs(max_jobs integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_max_jobs.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF _check_max_jobs.max_jobs NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 100000, got %s', _check_max_jobs.max_jobs));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgq.sweep(max_jobs integer DEFAULT 1000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
DECLARE
    total integer := 0;
    r record;
BEGIN
    PERFORM pgq._check_max_jobs(sweep.max_jobs);
    -- Durable execution (workflows.sql): signals' checks, signal waits' timeouts, lifetimes; first,
    -- before this call takes a transaction id of its own (pgq._settle_signals stamps with it).
    PERFORM pgq._settle_durable(sweep.max_jobs);
    FOR r IN SELECT x.queue, x.recovered FROM pgq._recover_expired(sweep.max_jobs, '-infinity') AS x LOOP
        total := total + r.recovered;
        IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = r.queue) THEN
            PERFORM pg_notify('pgq', r.queue);
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now()) THEN
        PERFORM pgq._fire_schedules(sweep.max_jobs);
    END IF;
    -- Dependencies: what pgq.settle_dependencies(max_jobs) does, after taking over what is left in
    -- the tables of before 0021.
    IF EXISTS (SELECT FROM pgq.dependency_checks) OR EXISTS (SELECT FROM pgq.dependency_backlog)
       OR EXISTS (SELECT FROM pgq.unique_successors) THEN
        PERFORM pgq._adopt_legacy(sweep.max_jobs);
    END IF;
    PERFORM pgq._settle_dependencies(sweep.max_jobs);
    -- Batches: the next steps of cancelled batches' cancellation, and the callbacks of sealed
    -- batches whose last members ended side by side (pgq._settle_batches).
    IF EXISTS (SELECT FROM pgq.batches AS b WHERE b.sealed_at IS NOT NULL AND b.callback_job_id IS NULL)
       OR EXISTS (SELECT FROM pgq.batches AS b WHERE b.cancel_after IS NOT NULL) THEN
        PERFORM pgq._settle_batches(least(sweep.max_jobs, 1000), sweep.max_jobs);
    END IF;
    -- Keeps pgq.finished_deltas short where no exporter calls pgq.metrics().
    PERFORM pgq._fold_finished();
    -- Forgets the per-key rate limits' buckets that are full again, and old keys' rows (keys.sql).
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(sweep.max_jobs);
    END IF;
    PERFORM pgq._prune_key_locks(sweep.max_jobs);
    -- The registry of workers: the entries an hour past their heartbeat (registry.sql).
    IF EXISTS (SELECT FROM pgq.worker_registry AS w WHERE w.alive_until < pgq._now() - interval '1 hour') THEN
        PERFORM pgq._prune_workers(sweep.max_jobs);
    END IF;
    -- Retention: up to ten per job of max_jobs (at most 100,000) finished jobs past their state's
    -- retention (pgq._sweep_retention).
    PERFORM pgq._sweep_retention(least(10 * sweep.max_jobs, 100000));
    -- The archive (archive.sql): queues with archive on have up to ten per job of max_jobs
    -- finished jobs moved there; its day partitions past retention are dropped.
    PERFORM pgq._sweep_archive(least(10 * sweep.max_jobs, 100000));
    RETURN total;
END
$$;

-- pgq.sweep's retention step: pgq._retire_finished(NULL, max_jobs), the jobs of each queue and
-- state past their retention, up to max_jobs, in a subtransaction that waits for no caller: the
-- jobs another transaction holds are skipped, and a lock on a row that goes with a job (its events,
-- steps, links, batch membership) not freed within 100 ms undoes the step, which the next sweep
-- does again. Returns how many jobs it deleted (0 when it gave up, or in a read-only transaction).
CREATE OR REPLACE FUNCTION pgq._sweep_retention(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET lock_timeout = '100ms'
    AS $$
BEGIN
    IF current_setting('transaction_read_only')::boolean THEN
        RETURN 0;
    END IF;
    BEGIN
        RETURN pgq._retire_finished(NULL, _sweep_retention.max_jobs);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
END
$$;
-- pgq.sweep's and pgq.settle_dependencies' work on the graph: the checks of enqueues that may have
-- overlapped an end (cheap: up to ten per job of max_jobs), then up to max_jobs dependants of the
-- backlog (pgq.cascade_backlog), both shared fairly among logins, never waiting; then up to ten
-- per job of max_jobs rows of ended transactions' cascade state. Each table is looked at only when
-- it has a row (one index probe each). Returns how many dependants it moved on.
CREATE OR REPLACE FUNCTION pgq._settle_dependencies(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
DECLARE
    moved integer := 0;
BEGIN
    IF EXISTS (SELECT FROM pgq.overlap_checks) THEN
        PERFORM pgq._settle_checks(least(10 * _settle_dependencies.max_jobs, 100000));
    END IF;
    IF EXISTS (SELECT FROM pgq.cascade_backlog) THEN
        moved := pgq._work_backlog(_settle_dependencies.max_jobs);
    END IF;
    IF EXISTS (SELECT FROM pgq.cascade_budgets) THEN
        PERFORM pgq._forget_cascades(least(10 * _settle_dependencies.max_jobs, 100000));
    END IF;
    RETURN moved;
END
$$;

-- Settles what enqueues and ends that overlapped left (a dependant whose enqueue was in flight
-- while its dependency ended is released, or cancelled, here, once both have committed), and
-- moves up to max_jobs dependants of the backlog on; fair among logins, bounded, never waiting.
-- First, durable execution's part (pgq._settle_durable: the signals' checks, the signal waits
-- whose timeout has passed, the jobs whose start_by or max_lifetime has passed, up to max_jobs
-- each). A worker calls it every poll (about once a second): with nothing to do it is six index
-- probes. Returns how many jobs it moved on.
CREATE OR REPLACE FUNCTION pgq.settle_dependencies(max_jobs integer DEFAULT 100)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
BEGIN
    PERFORM pgq._check_max_jobs(settle_dependencies.max_jobs);
    RETURN pgq._settle_durable(settle_dependencies.max_jobs) + pgq._settle_dependencies(settle_dependencies.max_jobs);
END
$$;
COMMENT ON FUNCTION pgq.settle_dependencies(integer) IS
    'Releases (or cancels) the dependants whose enqueue overlapped their dependency''s end, once both '
    'committed, and moves up to max_jobs dependants of the backlog on, fairly among logins, never '
    'waiting, and wakes the jobs of signals and timed-out signal waits and ends expired jobs; a worker '
    'calls it every poll. Returns how many jobs it moved on.';

COMMENT ON FUNCTION pgq.sweep(integer) IS
    'Recovers up to max_jobs running jobs whose lease expired or whose attempt timed out (returns '
    'how many), fires up to max_jobs due schedules, moves up to max_jobs waiting dependants on, '
    'settles batches (callbacks, cancellations), wakes and ends what durable execution leaves '
    '(signal waits, their timeouts, expired jobs), and deletes up to 10 x max_jobs (at most 100,000) '
    'finished jobs past their state''s retention.';
