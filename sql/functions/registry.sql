-- sql/functions/registry.sql: the registry of live workers (pgq.worker_registry, migration 0026).
--
-- * A worker announces itself and heartbeats with pgq.worker_heartbeat (every few seconds: the
--   Worker every heartbeat_interval, 10 s by default), naming what it claims and how many jobs it
--   runs; each call makes it alive for alive_for more; its last call (stopping => true) removes it.
--   An entry is keyed by the login that sent it (session_user) and the worker's name: a login
--   writes, refreshes and removes its own entries only, whatever name another login uses, and waits
--   for nobody else's (its row lock is its own; lock_timeout 5 s for a call of the same login and
--   name in flight). At most 10,000 entries per login (live or stale): the registry stays small
--   whatever a caller sends (54000 beyond).
-- * pgq.workers() lists the live entries (alive_until not passed): every login's for members of
--   pgq_monitor and pgq_admin, the caller's own for anyone else.
-- * pgq.queue_kinds(queues) tells a worker at its start which kinds of its queues' pending jobs a
--   live worker handles; the Worker warns about those none does. The kinds are read by skipping
--   through jobs_kind_ready_idx (one probe per kind, at most 100 kinds per queue, 100 queues).
-- * The sweep deletes the entries an hour past their alive_until (pgq._prune_workers); until then
--   pgq.health names the running jobs of a worker that stopped heartbeating.

-- Validates pgq.worker_heartbeat's arguments other than the claim's (worker, queues, kinds).
CREATE OR REPLACE FUNCTION pgq._check_heartbeat(running integer, host text, pid integer, alive_for interval,
                                                stopping boolean)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_heartbeat.running IS NULL THEN
        PERFORM pgq._bad_argument('running', 'must not be NULL');
    ELSIF _check_heartbeat.running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('running', format('must be between 0 and 100000, got %s', _check_heartbeat.running));
    END IF;
    IF length(_check_heartbeat.host) NOT BETWEEN 1 AND 255 THEN
        PERFORM pgq._bad_argument('host', 'must be NULL or 1 to 255 characters long');
    END IF;
    IF _check_heartbeat.pid < 0 THEN
        PERFORM pgq._bad_argument('pid', format('must be NULL or at least 0, got %s', _check_heartbeat.pid));
    END IF;
    IF _check_heartbeat.alive_for < interval '1 second' THEN
        PERFORM pgq._bad_argument('alive_for', format('must be at least 1 second, got %s', _check_heartbeat.alive_for));
    END IF;
    PERFORM pgq._check_interval('alive_for', _check_heartbeat.alive_for, interval '1 day');
    IF _check_heartbeat.stopping IS NULL THEN
        PERFORM pgq._bad_argument('stopping', 'must not be NULL');
    END IF;
END
$$;

-- Announces or refreshes the worker `worker` of the caller's login: it claims from `queues` (NULL:
-- all) the `kinds` (NULL: any), runs `running` jobs, on `host` as process `pid`, and counts as alive
-- for `alive_for` from now. Returns until when (its alive_until). With stopping => true the entry
-- goes (the worker has stopped) and it returns NULL.
CREATE OR REPLACE FUNCTION pgq.worker_heartbeat(worker text, queues text[] DEFAULT NULL, kinds text[] DEFAULT NULL,
                                                running integer DEFAULT 0, host text DEFAULT NULL,
                                                pid integer DEFAULT NULL, alive_for interval DEFAULT '1 minute',
                                                stopping boolean DEFAULT false)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    until timestamptz;
BEGIN
    PERFORM pgq._check_claim(worker_heartbeat.worker, worker_heartbeat.queues, 1, NULL, worker_heartbeat.kinds);
    PERFORM pgq._check_heartbeat(worker_heartbeat.running, worker_heartbeat.host, worker_heartbeat.pid,
                                 worker_heartbeat.alive_for, worker_heartbeat.stopping);
    IF worker_heartbeat.stopping THEN
        DELETE FROM pgq.worker_registry AS r
        WHERE r.login = session_user AND r.worker = worker_heartbeat.worker;
        RETURN NULL;
    END IF;
    UPDATE pgq.worker_registry AS r
    SET host = worker_heartbeat.host, pid = worker_heartbeat.pid, queues = worker_heartbeat.queues,
        kinds = worker_heartbeat.kinds, running = worker_heartbeat.running,
        -- Another process under the same name, or the same one back after it was taken for gone:
        -- a new start.
        started_at = CASE WHEN r.alive_until < pgq._now() OR r.host IS DISTINCT FROM worker_heartbeat.host
                               OR r.pid IS DISTINCT FROM worker_heartbeat.pid
                          THEN pgq._now() ELSE r.started_at END,
        last_seen = pgq._now(), alive_until = pgq._now() + worker_heartbeat.alive_for
    WHERE r.login = session_user AND r.worker = worker_heartbeat.worker
    RETURNING r.alive_until INTO until;
    IF FOUND THEN
        RETURN until;
    END IF;
    IF (SELECT count(*) FROM (SELECT FROM pgq.worker_registry AS r WHERE r.login = session_user LIMIT 10000) AS e)
       >= 10000 THEN
        RAISE EXCEPTION 'pgq: login % has 10000 entries in the registry of workers', quote_ident(session_user)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Reuse worker names (a stopped worker''s last heartbeat passes stopping => true); '
                         'the sweep deletes entries an hour after they stopped.';
    END IF;
    INSERT INTO pgq.worker_registry AS r (login, worker, host, pid, queues, kinds, running, started_at,
                                          last_seen, alive_until)
    VALUES (session_user, worker_heartbeat.worker, worker_heartbeat.host, worker_heartbeat.pid,
            worker_heartbeat.queues, worker_heartbeat.kinds, worker_heartbeat.running, pgq._now(), pgq._now(),
            pgq._now() + worker_heartbeat.alive_for)
    ON CONFLICT ON CONSTRAINT worker_registry_pkey DO UPDATE
    SET host = excluded.host, pid = excluded.pid, queues = excluded.queues, kinds = excluded.kinds,
        running = excluded.running, last_seen = excluded.last_seen, alive_until = excluded.alive_until
    RETURNING r.alive_until INTO until;
    RETURN until;
END
$$;
COMMENT ON FUNCTION pgq.worker_heartbeat(text, text[], text[], integer, text, integer, interval, boolean) IS
    'Announces or refreshes worker (of the caller''s login) in the registry of live workers: what it '
    'claims, how many jobs it runs, where; alive for alive_for. stopping => true removes it.';

-- The live workers: the entries whose alive_until has not passed, by login and name; every login's
-- for members of pgq_monitor and pgq_admin, the caller's own otherwise.
CREATE OR REPLACE FUNCTION pgq.workers()
    RETURNS TABLE (worker text, login text, host text, pid integer, queues text[], kinds text[],
                   running integer, started_at timestamptz, last_seen timestamptz, alive_until timestamptz)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT r.worker, r.login, r.host, r.pid, r.queues, r.kinds, r.running, r.started_at, r.last_seen,
           r.alive_until
    FROM pgq.worker_registry AS r
    WHERE r.alive_until > pgq._now()
      AND (r.login = session_user OR pg_has_role(session_user, 'pgq_monitor', 'MEMBER')
           OR pg_has_role(session_user, 'pgq_admin', 'MEMBER'))
    ORDER BY r.login, r.worker
    LIMIT 10000
$$;
COMMENT ON FUNCTION pgq.workers() IS
    'The live workers (those whose heartbeat has not run out): name, login, host, pid, queues, kinds, '
    'jobs running, started and last seen. Every login''s for pgq_monitor and pgq_admin, else one''s own.';

-- The kinds of `queue`'s pending jobs (due or not), in name order, at most `max_kinds`: one probe of
-- jobs_kind_ready_idx per kind (skipping from each kind to the next).
CREATE OR REPLACE FUNCTION pgq._pending_kinds(queue text, max_kinds integer)
    RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE k(kind, n) AS (
        (SELECT j.kind, 1 FROM pgq.jobs AS j
         WHERE j.queue = _pending_kinds.queue AND j.state = 'pending' AND j.attempt < j.max_attempts
         ORDER BY j.kind LIMIT 1)
        UNION ALL
        SELECT (SELECT j.kind FROM pgq.jobs AS j
                WHERE j.queue = _pending_kinds.queue AND j.kind > k.kind
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                ORDER BY j.kind LIMIT 1), k.n + 1
        FROM k WHERE k.kind IS NOT NULL AND k.n < _pending_kinds.max_kinds
    )
    SELECT k.kind FROM k WHERE k.kind IS NOT NULL
$$;

-- Whether a live worker of the registry claims `kind` from `queue`.
CREATE OR REPLACE FUNCTION pgq._kind_handled(queue text, kind text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT FROM pgq.worker_registry AS r
                   WHERE r.alive_until > pgq._now()
                     AND (r.queues IS NULL OR _kind_handled.queue = ANY (r.queues))
                     AND (r.kinds IS NULL OR _kind_handled.kind = ANY (r.kinds)))
$$;

-- For a worker at its start: the kinds of the pending jobs (due or not) of each of `queues` (NULL:
-- every queue; at most 100 queues, 100 kinds each) that the caller's login may claim from and read,
-- and whether a live worker of the registry claims each (the caller included, once it has
-- heartbeat).
CREATE OR REPLACE FUNCTION pgq.queue_kinds(queues text[] DEFAULT NULL)
    RETURNS TABLE (queue text, kind text, handled boolean)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    AS $$
BEGIN
    PERFORM pgq._check_queues(queue_kinds.queues);
    RETURN QUERY
    SELECT q.name, k.kind, pgq._kind_handled(q.name, k.kind)
    FROM (SELECT x.name, x.restricted FROM pgq.queues AS x
          WHERE queue_kinds.queues IS NULL OR x.name = ANY (queue_kinds.queues)
          ORDER BY x.name LIMIT 100) AS q
    CROSS JOIN LATERAL pgq._pending_kinds(q.name, 100) AS k(kind)
    WHERE pgq._may(q.name, q.restricted, 'claim') AND pgq._may(q.name, q.restricted, 'read')
    ORDER BY q.name, k.kind;
END
$$;
COMMENT ON FUNCTION pgq.queue_kinds(text[]) IS
    'For each queue (NULL: all; at most 100) the caller may claim from and read: the kinds of its '
    'pending jobs (at most 100) and whether a live worker of the registry claims each.';

-- The sweep's registry step: up to max_entries entries an hour past their alive_until, deleted.
CREATE OR REPLACE FUNCTION pgq._prune_workers(max_entries integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    gone integer;
BEGIN
    DELETE FROM pgq.worker_registry AS r
    WHERE (r.login, r.worker) IN (SELECT s.login, s.worker FROM pgq.worker_registry AS s
                                  WHERE s.alive_until < pgq._now() - interval '1 hour'
                                  ORDER BY s.alive_until LIMIT _prune_workers.max_entries
                                  FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS gone = ROW_COUNT;
    RETURN gone;
END
$$;
