-- sql/functions/health.sql: pgq.health: findings for dashboards, alerts and readiness probes.

-- pgq.health's check of kinds no worker claims (a Worker claims only the kinds it has handlers for):
-- a kind whose due jobs wait much longer than the rest of its queue while workers claim the queue's
-- other kinds.
CREATE OR REPLACE FUNCTION pgq._health_kinds(max_ready_age interval)
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    r record;
    found_any boolean;
BEGIN
    -- "Much longer": past half of max_ready_age, and ten times the oldest due job of
    -- the queue's other kinds; "workers claim": a job of another kind of the queue was claimed
    -- after this kind's oldest due job came due (running now, or finished since).
    found_any := false;
    FOR r IN
        WITH due AS (
            SELECT j.queue, j.kind, min(j.run_at) AS oldest, count(*) AS n
            FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name
            WHERE NOT q.paused AND j.state = 'pending' AND j.attempt < j.max_attempts
              AND j.run_at <= pgq._now()
            GROUP BY j.queue, j.kind
        )
        SELECT d.queue, d.kind, d.n, pgq._now() - d.oldest AS age,
               coalesce((SELECT pgq._now() - min(o.oldest) FROM due AS o
                         WHERE o.queue = d.queue AND o.kind <> d.kind), interval '0') AS others
        FROM due AS d
        WHERE pgq._now() - d.oldest > _health_kinds.max_ready_age / 2
          -- The finished jobs are looked for among the newest 1,000 of each finished state of the
          -- queue (jobs_list_idx): a bounded read, where all jobs finished since d.oldest could be
          -- the whole history of a queue stuck for hours (a job claimed after d.oldest finished
          -- after it).
          AND (EXISTS (SELECT FROM pgq.jobs AS w
                       WHERE w.lease_until IS NOT NULL AND w.queue = d.queue AND w.kind <> d.kind
                         AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'done' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'failed' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'cancelled' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest))
        ORDER BY d.queue, d.kind
    LOOP
        CONTINUE WHEN r.age <= r.others * 10;
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > _health_kinds.max_ready_age THEN 'critical' ELSE 'warning' END,
            'unclaimed_kind',
            format('queue %s: %s due job(s) of kind %s have waited up to %s while workers claim its other '
                   'kinds (whose due jobs waited at most %s)', r.queue, r.n, r.kind,
                   date_trunc('second', r.age), date_trunc('second', r.others)),
            'No running worker handles this kind: start one that does, or cancel these jobs.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'unclaimed_kind', 'no kind waits much longer than the rest of its queue', NULL::text;
    END IF;
END
$$;

-- pgq.health's checks of the registry of live workers (registry.sql), at once, without waiting for
-- jobs to age: the workers that stopped heartbeating while they held running jobs (their leases will
-- run out; a hung worker's never will, were it to renew), and the kinds of a queue's pending jobs
-- that none of the queue's live workers handles. Workers that do not heartbeat are not counted.
CREATE OR REPLACE FUNCTION pgq._health_workers()
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    r record;
    found_any boolean := false;
BEGIN
    -- One pass over the running jobs (jobs_lease_idx), each looked up in the registry by its login
    -- and worker name.
    FOR r IN
        SELECT w.worker, w.login, w.host, w.pid, w.alive_until, count(*) AS n,
               (array_agg(j.id ORDER BY j.id))[1:5] AS ids
        FROM pgq.jobs AS j
        JOIN pgq.worker_registry AS w ON w.login = j.session_role AND w.worker = j.claimed_by
        WHERE j.lease_until IS NOT NULL AND j.state = 'running' AND w.alive_until <= pgq._now()
        GROUP BY w.login, w.worker, w.host, w.pid, w.alive_until
        ORDER BY w.login, w.worker
        LIMIT 20
    LOOP
        found_any := true;
        RETURN QUERY SELECT 'warning', 'silent_workers',
            format('worker %s (login %s%s) stopped heartbeating %s ago and holds %s running job(s): %s%s',
                   r.worker, r.login,
                   CASE WHEN r.host IS NOT NULL THEN format(', %s pid %s', r.host, r.pid) ELSE '' END,
                   date_trunc('second', pgq._now() - r.alive_until), r.n, array_to_string(r.ids, ', '),
                   CASE WHEN r.n > 5 THEN ', ...' ELSE '' END),
            'Its jobs come back when their leases expire (the sweep); a worker that is hung, not dead, '
            'should be stopped.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'silent_workers', 'no worker holding running jobs has stopped heartbeating',
            NULL::text;
    END IF;

    found_any := false;
    FOR r IN
        SELECT q.name, k.kind, q.live
        FROM (SELECT x.name, (SELECT count(*) FROM pgq.worker_registry AS w
                              WHERE w.alive_until > pgq._now() AND (w.queues IS NULL OR x.name = ANY (w.queues))) AS live
              FROM pgq.queues AS x WHERE NOT x.paused ORDER BY x.name LIMIT 1000) AS q
        CROSS JOIN LATERAL pgq._pending_kinds(q.name, 100) AS k(kind)
        WHERE q.live > 0 AND NOT pgq._kind_handled(q.name, k.kind)
        ORDER BY q.name, k.kind
        LIMIT 50
    LOOP
        found_any := true;
        RETURN QUERY SELECT 'warning', 'unhandled_kinds',
            format('queue %s: pending jobs of kind %s, which none of its %s live worker(s) handles',
                   r.name, r.kind, r.live),
            'Start a worker with a handler for this kind, or cancel these jobs (workers that do not '
            'heartbeat through pgq.worker_heartbeat are not counted).';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'unhandled_kinds', 'the live workers of each queue handle every kind pending there',
            NULL::text;
    END IF;
END
$$;

-- pgq.health's checks of this database's sessions (pg_stat_activity, as the schema's owner; a
-- statement's text only to a caller who may read it there itself: pgq._may_see_query).
CREATE OR REPLACE FUNCTION pgq._health_sessions(max_snapshot_age interval)
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    r record;
    found_any boolean;
BEGIN
    -- 4. Sessions blocked by others (lock waits: a long transaction holding a job's row, say).
    found_any := false;
    FOR r IN
        SELECT a.pid, a.usename, pg_blocking_pids(a.pid) AS blockers,
               clock_timestamp() - a.query_start AS waited,
               CASE WHEN pgq._may_see_query(a.usesysid) THEN left(a.query, 80)
                    ELSE '(query not shown: another role''s session)' END AS query
        FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND cardinality(pg_blocking_pids(a.pid)) > 0
        ORDER BY a.query_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.waited > _health_sessions.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            'blocked_sessions',
            format('pid %s has waited %s for pid(s) %s (role %s): %s', r.pid, date_trunc('second', r.waited),
                   array_to_string(r.blockers, ', '), r.usename, r.query),
            'Look at what the blocking session is doing (pg_stat_activity); end it if it is stuck.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'blocked_sessions', 'no session waits for another', NULL::text;
    END IF;

    -- 5. Long transactions and idle-in-transaction sessions: their snapshot holds back vacuum of
    -- every table, pgq.jobs included, so dead rows pile up and claims slow down.
    found_any := false;
    FOR r IN
        SELECT a.pid, a.state, a.usename, clock_timestamp() - a.xact_start AS age,
               age(a.backend_xmin) AS xmin_age,
               CASE WHEN pgq._may_see_query(a.usesysid) THEN left(a.query, 80)
                    ELSE '(query not shown: another role''s session)' END AS query
        FROM pg_stat_activity AS a
        -- Only this database's sessions hold back vacuum of its tables.
        WHERE a.datname = current_database() AND a.xact_start IS NOT NULL
          AND a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
          AND clock_timestamp() - a.xact_start > _health_sessions.max_snapshot_age / 2
        ORDER BY a.xact_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > _health_sessions.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            CASE WHEN r.state LIKE 'idle in transaction%' THEN 'idle_in_transaction' ELSE 'long_transaction' END,
            format('pid %s (%s, %s) has held a snapshot for %s (xmin age %s transactions): %s', r.pid,
                   r.usename, r.state, date_trunc('second', r.age), r.xmin_age, r.query),
            'It holds back vacuum: end it, and set idle_in_transaction_session_timeout / statement_timeout.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'oldest_snapshot',
            format('no snapshot older than %s', _health_sessions.max_snapshot_age / 2), NULL::text;
    END IF;

    -- 6. Transactions that hold concurrency keys (their claims locked the keys' rows, pgq.key_locks)
    -- for long: every other claim of those keys leaves them out until they end. Found by the lock
    -- on the table (pg_locks), so that the rows, counted by their locker (xmax), are read only
    -- when there is such a transaction.
    found_any := false;
    FOR r IN
        SELECT a.pid, a.usename, a.state, clock_timestamp() - a.xact_start AS age,
               (SELECT count(DISTINCT (k.queue, k.key)) FROM pgq.key_locks AS k WHERE k.xmax = a.backend_xid) AS keys
        FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND clock_timestamp() - a.xact_start > _health_sessions.max_snapshot_age / 2
          AND EXISTS (SELECT FROM pg_locks AS l
                      WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.relation = 'pgq.key_locks'::regclass
                        AND l.mode = 'RowShareLock' AND l.granted)
        ORDER BY a.xact_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > _health_sessions.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            'held_keys',
            format('pid %s (%s, %s) has held %s key(s) of key-limited queues for %s: other claims leave '
                   'those keys out until it ends', r.pid, r.usename, r.state, r.keys, date_trunc('second', r.age)),
            'A transaction that claimed keyed jobs has not ended: end it (pg_terminate_backend), and set '
            'idle_in_transaction_session_timeout.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'held_keys',
            format('no transaction has held keys for more than %s', _health_sessions.max_snapshot_age / 2), NULL::text;
    END IF;
END
$$;

-- pgq.health's checks of what holds back vacuum from outside this database's sessions (read as
-- the schema's owner): replication slots (cluster-wide: a slot's xmin, which a standby's
-- hot_standby_feedback sets, holds back vacuum of every table, pgq.jobs included; its catalog_xmin,
-- a logical slot's, that of the system catalogs), walsenders' backend_xmin (a standby's
-- hot_standby_feedback without a slot: every table), and this database's prepared transactions
-- (they hold their snapshot until COMMIT PREPARED or ROLLBACK PREPARED, through restarts). Each
-- holder is one row with the age it holds, in transactions (and in time where PostgreSQL knows it:
-- a prepared transaction's). Severity: critical past half of autovacuum_freeze_max_age
-- transactions (anti-wraparound vacuum cannot freeze past it); for a prepared transaction, past
-- max_snapshot_age (warning past half of it), as for a session; for a slot or a standby, warning
-- past 1,000,000 transactions or, for an inactive slot (nothing consumes it: its age only grows),
-- at any age; ok otherwise (listed: it holds vacuum back by that much). The standbys' xmin is read
-- from pg_stat_replication, which shows it only to members of pg_read_all_stats (pg_monitor has
-- it): an owner without it is told so.
CREATE OR REPLACE FUNCTION pgq._health_xmin_holders(max_snapshot_age interval)
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    r record;
    found_any boolean;
    wraparound bigint := current_setting('autovacuum_freeze_max_age')::bigint / 2;
    many constant bigint := 1000000;
BEGIN
    found_any := false;
    FOR r IN
        SELECT s.slot_name, s.slot_type, s.database, s.active, age(s.xmin) AS xmin_age,
               age(s.catalog_xmin) AS catalog_age
        FROM pg_replication_slots AS s
        WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
        ORDER BY greatest(age(s.xmin), age(s.catalog_xmin)) DESC, s.slot_name
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN greatest(r.xmin_age, r.catalog_age) > wraparound THEN 'critical'
                 WHEN NOT r.active OR r.xmin_age > many THEN 'warning'
                 ELSE 'ok' END,
            'replication_slot',
            format('%s replication slot %s%s (%s) holds %s', r.slot_type, r.slot_name,
                   coalesce(' of database ' || r.database, ''), CASE WHEN r.active THEN 'active' ELSE 'inactive' END,
                   concat_ws(' and ',
                             'xmin age ' || r.xmin_age || ' transactions (vacuum of every table, pgq.jobs included)',
                             'catalog_xmin age ' || r.catalog_age || ' transactions (vacuum of the system catalogs)')),
            CASE WHEN NOT r.active
                 THEN format('Nothing consumes it: start its consumer or standby, or drop it with '
                             'SELECT pg_drop_replication_slot(%L).', r.slot_name)
                 ELSE 'Its consumer is behind, or (xmin) a standby with hot_standby_feedback runs a long query: '
                      'see that standby''s pg_stat_activity, and its max_standby_streaming_delay.' END;
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'replication_slot', 'no replication slot holds back vacuum', NULL::text;
    END IF;

    found_any := false;
    FOR r IN
        SELECT w.pid, w.application_name, w.client_addr, w.state, age(w.backend_xmin) AS xmin_age
        FROM pg_stat_replication AS w
        WHERE w.backend_xmin IS NOT NULL
        ORDER BY age(w.backend_xmin) DESC, w.pid
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.xmin_age > wraparound THEN 'critical' WHEN r.xmin_age > many THEN 'warning' ELSE 'ok' END,
            'standby_feedback',
            format('standby %s (walsender pid %s, %s, %s) feeds back xmin age %s transactions '
                   '(hot_standby_feedback: vacuum of every table here, pgq.jobs included, waits for it)',
                   coalesce(nullif(r.application_name, ''), '(unnamed)'), r.pid,
                   coalesce(host(r.client_addr), 'local'), r.state, r.xmin_age),
            'A query on that standby holds it: see the standby''s pg_stat_activity and end it; bound such queries '
            'there with statement_timeout, or turn hot_standby_feedback off (queries may then be cancelled).';
    END LOOP;
    IF NOT found_any THEN
        IF EXISTS (SELECT FROM pg_stat_replication) AND NOT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN
            RETURN QUERY SELECT 'warning', 'standby_feedback',
                format('%s walsender(s) run, but pgq''s owner %s may not read their xmin',
                       (SELECT count(*) FROM pg_stat_replication), current_user),
                'GRANT pg_monitor TO the owner of schema pgq, so that health sees what standbys hold back.';
        ELSE
            RETURN QUERY SELECT 'ok', 'standby_feedback', 'no standby feeds back an xmin', NULL::text;
        END IF;
    END IF;

    found_any := false;
    FOR r IN
        SELECT p.gid, p.owner, p.prepared, age(p.transaction) AS xmin_age, clock_timestamp() - p.prepared AS age
        FROM pg_prepared_xacts AS p
        WHERE p.database = current_database()
        ORDER BY p.prepared, p.gid
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > _health_xmin_holders.max_snapshot_age OR r.xmin_age > wraparound THEN 'critical'
                 WHEN r.age > _health_xmin_holders.max_snapshot_age / 2 THEN 'warning'
                 ELSE 'ok' END,
            'prepared_transaction',
            format('prepared transaction %s (owner %s) has held its snapshot for %s (xmin age %s transactions)',
                   quote_literal(r.gid), r.owner, date_trunc('second', r.age), r.xmin_age),
            format('It holds back vacuum (and its locks) until it is settled: have its transaction manager settle '
                   'it, or, as its owner or a superuser, COMMIT PREPARED %L or ROLLBACK PREPARED %L.', r.gid, r.gid);
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'prepared_transaction', 'no prepared transaction in this database', NULL::text;
    END IF;
END
$$;

-- Health: one row per finding, for dashboards, alerts and readiness probes (pgq-thin doctor).
-- severity: ok, warning or critical. The thresholds are arguments so operators (and tests) can
-- tighten them. Sequential scans are off: with statistics taken before a history arrived the
-- planner read all of pgq.jobs for the due jobs. Session checks read pg_stat_activity: the schema owner needs the pg_monitor role
-- (or to be a superuser) to see other roles' sessions.
-- pgq.health's check of the sequence queues with key_sequence 'halt': their halted keys, each a key
-- whose head (its oldest job that is live or failed: pgq._sequence_head) failed for good,
-- so that its later jobs wait for an operator. Per such queue, its failed keyed jobs through
-- jobs_retention_idx, at most 1000 of them looked at, each probed once; the first 10 halted keys
-- are named.
CREATE OR REPLACE FUNCTION pgq._health_sequences()
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE sql STABLE
    AS $$
    WITH halted AS (
        SELECT q.name AS queue, f.key, f.id
        FROM pgq.queues AS q
        CROSS JOIN LATERAL (
            SELECT j.concurrency_key AS key, j.id FROM pgq.jobs AS j
            WHERE j.queue = q.name AND j.state = 'failed' AND j.concurrency_key IS NOT NULL
            ORDER BY j.finished_at LIMIT 1000
        ) AS f
        WHERE q.key_sequence = 'halt'
          AND f.id = (SELECT h.id FROM pgq._sequence_head(q.name, f.key, true) AS h)
    ), listed AS (
        SELECT h.queue, h.key, h.id FROM halted AS h ORDER BY h.queue, h.key LIMIT 10
    )
    SELECT 'warning', 'halted_keys',
           format('%s halted key(s) in sequence queues: %s', (SELECT count(*) FROM halted),
                  (SELECT string_agg(format('queue %s key %s (job %s failed)', l.queue, quote_literal(l.key), l.id),
                                     ', ' ORDER BY l.queue, l.key) FROM listed AS l)),
           'Their later jobs wait: pgq.retry(id) runs the failed job again (pgq.retry_jobs(queue, ''failed'') '
           'all of them), pgq.delete_jobs(queue, ''failed'', ...) removes it and lets the key go on.'
    WHERE EXISTS (SELECT FROM halted)
    UNION ALL
    SELECT 'ok', 'halted_keys', 'no sequence queue has a halted key', NULL::text
    WHERE NOT EXISTS (SELECT FROM halted)
$$;

CREATE OR REPLACE FUNCTION pgq.health(max_snapshot_age interval DEFAULT '5 minutes',
                           max_ready_age interval DEFAULT '5 minutes')
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET jit = off
    AS $$
DECLARE
    r record;
    found_any boolean;
BEGIN
    PERFORM pgq._check_interval('max_snapshot_age', health.max_snapshot_age, interval '365 days');
    PERFORM pgq._check_interval('max_ready_age', health.max_ready_age, interval '365 days');

    -- 1. Expired leases not yet recovered: workers have died and nobody claims or sweeps.
    SELECT count(*) AS n, min(j.lease_until) AS oldest INTO r
    FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now();
    IF r.n = 0 THEN
        RETURN QUERY SELECT 'ok', 'expired_leases', 'no expired leases', NULL::text;
    ELSE
        RETURN QUERY SELECT
            CASE WHEN pgq._now() - r.oldest > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'expired_leases',
            format('%s running job(s) past their lease, the oldest expired %s ago', r.n,
                   date_trunc('second', pgq._now() - r.oldest)),
            'No worker is claiming or sweeping: run pgq.sweep() and check the workers.';
    END IF;

    -- 2. Oldest due job per unpaused queue: is the queue keeping up?
    found_any := false;
    FOR r IN
        SELECT q.name, pgq._now() - min(j.run_at) AS age, count(*) AS n
        FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name
        WHERE NOT q.paused AND j.state = 'pending' AND j.attempt < j.max_attempts
          AND j.run_at <= pgq._now()
        GROUP BY q.name
        HAVING pgq._now() - min(j.run_at) > health.max_ready_age / 2
        ORDER BY q.name
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'ready_age',
            format('queue %s: the oldest of %s due job(s) has waited %s', r.name, r.n, date_trunc('second', r.age)),
            'Add workers or concurrency, or look for a stuck handler.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'ready_age',
            format('no due job has waited more than %s', health.max_ready_age / 2), NULL::text;
    END IF;

    RETURN QUERY SELECT * FROM pgq._health_kinds(health.max_ready_age);
    RETURN QUERY SELECT * FROM pgq._health_workers();
    RETURN QUERY SELECT * FROM pgq._health_sequences();

    -- 3. Jobs parked as outcome_unknown wait for a person.
    -- Per queue, through jobs_list_idx: a count over all jobs would read the finished history.
    SELECT coalesce(sum(u.n), 0) AS n, min(u.oldest) AS oldest INTO r
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (SELECT count(*) AS n, min(j.claimed_at) AS oldest FROM pgq.jobs AS j
                        WHERE j.queue = q.name AND j.state = 'outcome_unknown') AS u;
    IF r.n = 0 THEN
        RETURN QUERY SELECT 'ok', 'outcome_unknown', 'no job waits for a decision', NULL::text;
    ELSE
        RETURN QUERY SELECT 'warning', 'outcome_unknown',
            format('%s job(s) in outcome_unknown, the oldest claimed %s ago', r.n,
                   date_trunc('second', pgq._now() - r.oldest)),
            'Find out what happened, then pgq.resolve(id, ''done'' | ''pending'' | ''failed'' | ''cancelled'').';
    END IF;

    RETURN QUERY SELECT * FROM pgq._health_sessions(health.max_snapshot_age);
    RETURN QUERY SELECT * FROM pgq._health_xmin_holders(health.max_snapshot_age);

    -- 7. Dead tuples and vacuum of pgq's tables; index sizes, for the record.
    FOR r IN
        SELECT s.relname, s.n_live_tup, s.n_dead_tup, greatest(s.last_autovacuum, s.last_vacuum) AS vacuumed
        FROM pg_stat_user_tables AS s WHERE s.schemaname = 'pgq' ORDER BY s.relname
    LOOP
        RETURN QUERY SELECT
            CASE WHEN r.n_dead_tup > 10000 AND r.n_dead_tup > r.n_live_tup THEN 'warning' ELSE 'ok' END,
            'dead_tuples',
            format('pgq.%s: %s live, %s dead rows, last vacuumed %s', r.relname, r.n_live_tup, r.n_dead_tup,
                   coalesce(date_trunc('second', pgq._now() - r.vacuumed)::text || ' ago', 'never')),
            CASE WHEN r.n_dead_tup > 10000 AND r.n_dead_tup > r.n_live_tup
                 THEN 'Autovacuum is not keeping up: look for old snapshots (above) and vacuum settings.' END;
    END LOOP;
    RETURN QUERY
    SELECT 'ok', 'index_size',
           format('%s: %s', i.indexrelid::regclass, pg_size_pretty(pg_relation_size(i.indexrelid))), NULL::text
    FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indrelid
    WHERE c.relnamespace = 'pgq'::regnamespace
    ORDER BY i.indexrelid::regclass::text;
END
$$;
COMMENT ON FUNCTION pgq.health(interval, interval) IS
    'One row per finding (severity ok / warning / critical, check, detail, hint): expired leases, '
    'waiting jobs, kinds no worker claims, halted keys of sequence queues, outcome_unknown jobs, blocked '
    'sessions, old snapshots, held keys, '
    'what else holds back vacuum (replication slots, standbys'' feedback, prepared transactions), dead '
    'tuples, index sizes.';
