-- pgq migration 0008: security (issue 18). Jobs are bound to the database login that claimed
-- them, queues can be restricted per role, and pgq.health shows other sessions' SQL only to those
-- who may read it anyway.
--
-- * Workers act only on their own jobs. Any pgq_worker login could complete, fail, renew or park
--   any running job by guessing its attempt, and the real owner's repeated complete then also
--   answered true. Now the claim records session_user (jobs.session_role); every owner operation
--   (renew, complete, complete_many, fail, release, snooze, mark_unknown, progress) from another
--   login is answered "not yours" and leaves a rejected event, unless that login is a member of
--   pgq_admin; a repeated call is recognised only from the login that made it (owner operations
--   that end an attempt record their login in jobs.session_role). Every event records the login
--   that caused it (job_events.session_role, shown by pgq.job_history).
-- * Per-queue grants: pgq.grant_queue / pgq.revoke_queue / pgq.queue_grants and the table
--   pgq.grants. A queue's restricted column names the privileges that have grants, so a queue
--   without grants costs a claim or an enqueue one NULL test. get_job, job_history, list_jobs and
--   schedules show a queue whose read grants do not admit the login as if it had no jobs.
-- * pgq.health shows a session's statement text only where the caller could read it in
--   pg_stat_activity itself.
-- * No function ever gets PUBLIC EXECUTE: besides this file's REVOKEs, migrations/post-apply.sql
--   (a yoyo post-apply hook, run after every migration run) revokes EXECUTE on every pgq
--   function from PUBLIC, so a later migration that forgets to cannot expose a function.
-- The changed functions are as 0007 (claim, fail), 0006 (list_jobs, health), 0004 (enqueue,
-- enqueue_many, renew, progress, schedules) and 0001 (_reject, complete, complete_many, release,
-- snooze, mark_unknown, get_job, job_history) left them, each with the lines this issue adds.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TABLE pgq.jobs ADD COLUMN session_role text;
COMMENT ON COLUMN pgq.jobs.session_role IS
    'The database login (session_user) of the job''s latest claim or owner operation: the owner '
    'operations of a running attempt are accepted only from this login (or a member of pgq_admin), '
    'and a repeated one is recognised only from the login that made it. NULL: claimed before 0008.';

-- Added without a default, then given one: a default in ADD COLUMN would be evaluated once and
-- stored for every existing event, naming the login that ran this migration.
ALTER TABLE pgq.job_events ADD COLUMN session_role text;
ALTER TABLE pgq.job_events ALTER COLUMN session_role SET DEFAULT session_user;
COMMENT ON COLUMN pgq.job_events.session_role IS
    'The database login (session_user) whose call caused the event; worker is the name the caller '
    'gave, which any login can give. NULL for events written before migration 0008.';

ALTER TABLE pgq.queues ADD COLUMN restricted text[];
COMMENT ON COLUMN pgq.queues.restricted IS
    'The privileges (enqueue, claim, read) that have grants on this queue (pgq.grant_queue), in '
    'name order; NULL when it has none. Only a restricted queue pays for a look at pgq.grants.';


-- Per-queue grants (pgq.grant_queue). Once a queue has a grant of a privilege (enqueue, claim,
-- read), only members of the granted roles, and of pgq_admin, may use that privilege on that
-- queue; each privilege is restricted on its own. A queue without grants stays open to every
-- holder of the pgq role and pays nothing for this table: queues.restricted (read with the
-- queue's settings anyway) names the privileges that have grants, and only those are looked up
-- here. Roles are kept by oid: a renamed role keeps its grants, a dropped one matches nobody
-- (the queue stays restricted), and a new role of the same name gets none.
CREATE TABLE pgq.grants (
    queue       text        NOT NULL REFERENCES pgq.queues (name) ON DELETE CASCADE,
    privilege   text        NOT NULL,
    role        oid         NOT NULL,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    granted_by  text        NOT NULL DEFAULT session_user,
    PRIMARY KEY (queue, privilege, role),
    CONSTRAINT grants_privilege_check CHECK (privilege IN ('enqueue', 'claim', 'read'))
);
COMMENT ON TABLE pgq.grants IS
    'Per-queue grants: which roles may enqueue into, claim from or read a queue that has grants of '
    'that privilege (pgq.grant_queue, pgq.revoke_queue, pgq.queue_grants).';
REVOKE ALL ON pgq.grants FROM PUBLIC;

-- pgq.list_jobs finds the queues with grants (few, if any) without reading the others.
CREATE INDEX queues_restricted_idx ON pgq.queues (name) WHERE restricted IS NOT NULL;

-- Functions: who may act ------------------------------------------------------------------------
--
-- A job is bound to the database login that claimed it (session_user, kept in
-- jobs.session_role): worker names are whatever a caller says, logins are what PostgreSQL
-- authenticated. The owner operations accept a running attempt's writes only from that login or
-- from a member of pgq_admin, and recognise a repeated call only from the login that made it.
-- Per-queue grants (pgq.grants) restrict enqueue, claim and read per queue. Both are decided on
-- session_user, not current_user: inside these SECURITY DEFINER functions current_user is the
-- schema's owner, and a SET ROLE does not change who logged in.

-- Whether the session's login may write to a running attempt whose job's session_role is
-- `owner`: it is the login that claimed it, or a member of pgq_admin (superusers are members of
-- every role); NULL (claimed before migration 0008) admits any login. One expression, inlined
-- into the owner operations' UPDATE: the common case costs one comparison, and pg_has_role runs
-- only for another login.
CREATE OR REPLACE FUNCTION pgq._owns(owner text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT $1 = session_user::text OR $1 IS NULL OR pg_has_role(session_user, 'pgq_admin', 'MEMBER') $$;

-- Whether the session's login made the latest owner operation of a job whose session_role is
-- `actor` (NULL: before migration 0008): only then is a repeated call answered as the first one.
CREATE OR REPLACE FUNCTION pgq._same_login(actor text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT $1 = session_user::text OR $1 IS NULL $$;

-- Whether the session's login may use `privilege` on `queue`, whose queues.restricted is
-- `restricted`: always when that privilege has no grant on the queue; otherwise for members of a
-- role granted it (read: granted read or claim, since a worker reads the jobs it may claim) and
-- of pgq_admin.
CREATE OR REPLACE FUNCTION pgq._may(queue text, restricted text[], privilege text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT _may.restricted IS NULL OR NOT _may.privilege = ANY (_may.restricted)
        OR pg_has_role(session_user, 'pgq_admin', 'MEMBER')
        OR EXISTS (SELECT FROM pgq.grants AS g
                   WHERE g.queue = _may.queue
                     AND (g.privilege = _may.privilege OR (_may.privilege = 'read' AND g.privilege = 'claim'))
                     AND pg_has_role(session_user, g.role, 'MEMBER'))
$$;

-- Whether the session's login may read the jobs of `queue` (true for a queue that does not exist).
CREATE OR REPLACE FUNCTION pgq._may_read(queue text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((SELECT pgq._may(q.name, q.restricted, 'read') FROM pgq.queues AS q
                     WHERE q.name = _may_read.queue), true)
$$;

-- Raises 42501: the queue's grants of `privilege` do not admit the session's login.
CREATE OR REPLACE FUNCTION pgq._denied(queue text, privilege text) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RAISE EXCEPTION 'pgq: login % may not % queue %', quote_ident(session_user),
        CASE _denied.privilege WHEN 'enqueue' THEN 'enqueue into' WHEN 'claim' THEN 'claim from' ELSE 'read' END,
        quote_literal(_denied.queue)
        USING ERRCODE = 'insufficient_privilege',
              HINT = format('The queue has %s grants, none to a role of this login: an admin adds one '
                            'with pgq.grant_queue(%L, <role>, %L).', _denied.privilege, _denied.queue,
                            _denied.privilege);
END
$$;

-- For pgq.claim's reads of the eligible queues, called only for a queue with grants: whether the
-- login may claim from it; a queue the claim named and may not claim from raises 42501 (a claim
-- of all queues skips it).
CREATE OR REPLACE FUNCTION pgq._may_claim(queue text, restricted text[], named boolean) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF pgq._may(_may_claim.queue, _may_claim.restricted, 'claim') THEN
        RETURN true;
    END IF;
    IF _may_claim.named THEN
        PERFORM pgq._denied(_may_claim.queue, 'claim');
    END IF;
    RETURN false;
END
$$;

-- Whether a session may read another session's statement text in pg_stat_activity itself: its
-- login has the privileges of that session's role, or of pg_read_all_stats (superusers have
-- both). pgq.health runs as the schema's owner, who may read more.
CREATE OR REPLACE FUNCTION pgq._may_see_query(usesysid oid) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(pg_has_role(session_user, _may_see_query.usesysid, 'USAGE'), false)
        OR pg_has_role(session_user, 'pg_read_all_stats', 'USAGE')
$$;

-- Validates the arguments of pgq.grant_queue and pgq.revoke_queue (in this order: queue, role,
-- privilege) and locks the queue's row, so that the grants and revokes of one queue take turns;
-- returns the role's oid. For a revoke (dropped_ok), a role that no longer exists may be named by
-- the oid pgq.queue_grants lists for it.
CREATE OR REPLACE FUNCTION pgq._grant_target(queue text, role text, privilege text, dropped_ok boolean)
    RETURNS oid
    LANGUAGE plpgsql
    AS $$
DECLARE
    role_oid oid;
BEGIN
    PERFORM pgq._existing_queue('queue', _grant_target.queue);
    IF _grant_target.role IS NULL THEN
        PERFORM pgq._bad_argument('role', 'must not be NULL', 'Name a role: a group role the logins are members of, say.');
    END IF;
    SELECT r.oid INTO role_oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = _grant_target.role;
    IF NOT FOUND AND _grant_target.dropped_ok AND _grant_target.role ~ '^[0-9]{1,10}$' THEN
        SELECT g.role INTO role_oid FROM pgq.grants AS g
        WHERE g.queue = _grant_target.queue AND g.role = _grant_target.role::bigint
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid = g.role)
        LIMIT 1;
    END IF;
    IF role_oid IS NULL THEN
        PERFORM pgq._bad_argument('role', format('names no role: %s', left(quote_literal(_grant_target.role), 80)),
            'Roles are cluster-wide: CREATE ROLE it first. PUBLIC is not a role here: a queue without '
            'grants is open to every holder of the pgq roles.');
    END IF;
    IF _grant_target.privilege IS NULL THEN
        PERFORM pgq._bad_argument('privilege', 'must not be NULL');
    ELSIF _grant_target.privilege NOT IN ('enqueue', 'claim', 'read') THEN
        PERFORM pgq._bad_argument('privilege',
            format('must be one of enqueue, claim, read, got %s', left(quote_literal(_grant_target.privilege), 40)));
    END IF;
    PERFORM FROM pgq.queues AS q WHERE q.name = _grant_target.queue FOR NO KEY UPDATE;
    RETURN role_oid;
END
$$;

-- Keeps queues.restricted equal to the privileges that have grants on the queue.
CREATE OR REPLACE FUNCTION pgq._refresh_restricted(queue text) RETURNS text[]
    LANGUAGE sql
    AS $$
    UPDATE pgq.queues AS q
    SET restricted = (SELECT array_agg(DISTINCT g.privilege ORDER BY g.privilege) FROM pgq.grants AS g
                      WHERE g.queue = _refresh_restricted.queue)
    WHERE q.name = _refresh_restricted.queue
    RETURNING q.restricted
$$;

-- Functions: per-queue grants ---------------------------------------------------------------------

-- Lets the members of `role` use `privilege` (enqueue, claim or read) on an existing queue. The
-- queue's first grant of a privilege restricts that privilege to the granted roles (and
-- pgq_admin) from the grant's commit on. Returns true when the grant is new, false when it was
-- there already.
CREATE OR REPLACE FUNCTION pgq.grant_queue(queue text, role text, privilege text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    role_oid oid := pgq._grant_target(grant_queue.queue, grant_queue.role, grant_queue.privilege, false);
    added boolean;
BEGIN
    INSERT INTO pgq.grants AS g (queue, privilege, role)
    VALUES (grant_queue.queue, grant_queue.privilege, role_oid)
    ON CONFLICT DO NOTHING;
    added := FOUND;
    PERFORM pgq._refresh_restricted(grant_queue.queue);
    RETURN added;
END
$$;
COMMENT ON FUNCTION pgq.grant_queue(text, text, text) IS
    'Lets members of role enqueue into, claim from or read (privilege) the queue; once a queue has a '
    'grant of a privilege, only granted roles and pgq_admin have it. True when new.';

-- Takes a grant back. When it was the queue's last grant of that privilege, the privilege is open
-- again to every holder of the pgq role (a NOTICE says so): to keep a queue closed, grant the
-- privilege to another role (pgq_admin, say) first. Returns true when there was such a grant.
CREATE OR REPLACE FUNCTION pgq.revoke_queue(queue text, role text, privilege text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    role_oid oid := pgq._grant_target(revoke_queue.queue, revoke_queue.role, revoke_queue.privilege, true);
    removed boolean;
    restricted text[];
BEGIN
    DELETE FROM pgq.grants AS g
    WHERE g.queue = revoke_queue.queue AND g.privilege = revoke_queue.privilege AND g.role = role_oid;
    removed := FOUND;
    restricted := pgq._refresh_restricted(revoke_queue.queue);
    IF removed AND NOT revoke_queue.privilege = ANY (coalesce(restricted, '{}')) THEN
        RAISE NOTICE 'pgq: queue % has no % grant left: every holder of the pgq role has that privilege again',
            quote_literal(revoke_queue.queue), revoke_queue.privilege;
    END IF;
    RETURN removed;
END
$$;
COMMENT ON FUNCTION pgq.revoke_queue(text, text, text) IS
    'Takes back a grant of pgq.grant_queue; true when there was one. Without grants of a privilege '
    'left, the queue is open for it again.';

-- The grants of one queue (or of all queues), by queue, privilege and role. A dropped role is
-- listed by its former oid.
CREATE OR REPLACE FUNCTION pgq.queue_grants(queue text DEFAULT NULL)
    RETURNS TABLE (queue text, privilege text, role text, granted_at timestamptz, granted_by text)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT pgq._existing_queue('queue', queue_grants.queue) WHERE queue_grants.queue IS NOT NULL;
    SELECT g.queue, g.privilege, coalesce(r.rolname::text, g.role::text), g.granted_at, g.granted_by
    FROM pgq.grants AS g
    LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = g.role
    WHERE queue_grants.queue IS NULL OR g.queue = queue_grants.queue
    ORDER BY 1, 2, 3;
$$;
COMMENT ON FUNCTION pgq.queue_grants(text) IS
    'The per-queue grants (of one queue, or all): queue, privilege, role, when and by whom.';

-- Changed functions ------------------------------------------------------------------------------

-- Records a rejected write by an owner that no longer owns the job (a stale attempt), so that a
-- duplicate execution can be diagnosed from pgq.job_events. Writes nothing for unknown ids or
-- for queues with audit off.
CREATE OR REPLACE FUNCTION pgq._reject(job_id bigint, attempt integer, operation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT j.id, _reject.attempt, NULL, 'rejected', j.state, NULL,
           format('%s from attempt %s rejected: the job is %s at attempt %s (last claimed by %s%s)',
                  _reject.operation, _reject.attempt, j.state, j.attempt, j.claimed_by,
                  CASE WHEN NOT pgq._same_login(j.session_role) THEN ', login ' || j.session_role END)
    FROM pgq.jobs AS j
    JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE j.id = _reject.job_id;
END
$$;

CREATE OR REPLACE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL)
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
                    AND pg_column_size(enqueue.payload) <= 1048576
                    AND coalesce(length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days', true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        IF length(enqueue.unique_key) NOT BETWEEN 1 AND 1024 THEN
            PERFORM pgq._bad_argument('unique_key', 'must be 1 to 1024 characters long');
        END IF;
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
    END IF;
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue.queue;
    IF NOT FOUND THEN
        q := pgq._queue(enqueue.queue);  -- first use: created with the defaults
    END IF;
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it.';

CREATE OR REPLACE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant);
    IF enqueue_many.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', enqueue_many.max_run_time, interval '365 days');
    END IF;
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pg_column_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    q := pgq._queue(enqueue_many.queue);
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
    -- the ids in payload order.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT i.id FROM inserted AS i ORDER BY i.id;

    IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order.';

-- THE CLAIM. One statement picks up to `batch` due pending jobs of the worker's (unpaused)
-- queues in the total order priority DESC, run_at, id, locks them FOR NO KEY UPDATE SKIP LOCKED
-- (rows other claimers hold are skipped, not waited for; a foreign-key KEY SHARE lock does not
-- hide a job), marks them running under a lease measured by the database clock, and increments
-- the attempt, the fencing token every later write must quote. Rows that changed after the
-- statement's snapshot are re-checked by PostgreSQL when locked, so a cancelled or already
-- claimed job is never returned; a batch may hold fewer rows than asked.
-- Expired leases are recovered first (a cheap index probe decides whether there are any), so a
-- crashed worker's job is claimable again as soon as its lease ends, with or without a sweep.
-- Due schedules of the claimed queues fire next: the queue rows read anyway say whether one is
-- due (queues.next_schedule_at), so their jobs are claimable by this very claim.
-- An attempt's lease never passes its deadline (claimed_at + max_run_time).
-- A worker that names its `kinds` gets only jobs of those kinds (NULL: any kind), read per kind
-- from jobs_kind_ready_idx, so jobs of kinds it cannot run wait untouched for a worker that can.
-- Two queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- and a fair queue's candidates come from pgq._fair_pick. Queues with neither pay nothing for them.
-- Before any of that, the failover fence: the first claim of a session checks that the fences
-- were moved on this server's timeline (pgq._check_timeline); later ones read one setting.
CREATE OR REPLACE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                          lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
    RETURNS SETOF pgq.claimed_job
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    -- A generic plan's cost can pass jit_above_cost on stale statistics (after a plain VACUUM,
    -- say), and compiling it then costs ~25 ms per claim: never worth it for a handful of rows.
    SET jit = off
    AS $$
DECLARE
    names    text[];     -- the eligible queues, in name order
    rooms    integer[];  -- how many jobs each may start now
    fairs    boolean[];  -- whether each is in fair mode
    fair_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running
    expired  boolean;    -- whether any lease has expired
    due      boolean;    -- whether one of them has a schedule due
    due_queues text[];   -- then: the eligible queues, whose due schedules fire
BEGIN
    IF claim.worker IS NULL THEN
        PERFORM pgq._bad_argument('worker', 'must not be NULL');
    ELSIF length(claim.worker) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('worker', 'must be 1 to 256 characters long');
    END IF;
    IF claim.batch IS NULL THEN
        PERFORM pgq._bad_argument('batch', 'must not be NULL');
    ELSIF claim.batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('batch', format('must be between 1 and 1000, got %s', claim.batch));
    END IF;
    IF claim.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', claim.lease, interval '1 day');
    END IF;
    IF claim.queues IS NOT NULL AND (cardinality(claim.queues) = 0 OR array_position(claim.queues, NULL) IS NOT NULL) THEN
        PERFORM pgq._bad_argument('queues', 'must be NULL (all queues) or a non-empty array without NULLs');
    END IF;
    -- A malformed name can never match a queue: say so instead of claiming nothing forever.
    -- Names cannot contain a comma, so one match of the joined names (pgq._is_name's pattern,
    -- repeated) checks them all in a plain expression (no query), and so does the length (no
    -- run of 129 characters without a comma; a joined list of 128 or fewer cannot hold one, and
    -- skips that match). Only a bad name pays for the per-name check that names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
           AND (length(array_to_string(claim.queues, ',')) <= 128
                OR array_to_string(claim.queues, ',') !~ '[^,]{129}'), false) THEN
        PERFORM pgq._check_name(format('queues[%s]', q.n), q.name)
        FROM unnest(claim.queues) WITH ORDINALITY AS q(name, n);
    END IF;
    -- The kinds are checked the same way, and only when given.
    IF claim.kinds IS NOT NULL THEN
        IF cardinality(claim.kinds) NOT BETWEEN 1 AND 1000 OR array_position(claim.kinds, NULL) IS NOT NULL THEN
            PERFORM pgq._bad_argument('kinds',
                'must be NULL (any kind) or an array of 1 to 1000 kinds without NULLs');
        END IF;
        IF NOT coalesce(
               array_to_string(claim.kinds, ',')
                   ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
               AND (length(array_to_string(claim.kinds, ',')) <= 128
                    OR array_to_string(claim.kinds, ',') !~ '[^,]{129}'), false) THEN
            PERFORM pgq._check_name(format('kinds[%s]', k.n), k.name)
            FROM unnest(claim.kinds) WITH ORDINALITY AS k(name, n);
        END IF;
    END IF;

    -- The failover fence, checked once per session (a session never outlives a promotion).
    IF coalesce(current_setting('pgq.fence', true), '') = '' THEN
        PERFORM pgq._check_timeline();
    END IF;

    -- One statement reads the eligible queues (and whether one of them has a schedule due: a
    -- column of the rows read anyway, and bool_or, which allocates nothing, unlike array_agg) and
    -- probes for expired leases (one index probe).
    SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
           coalesce(bool_or(q.max_running > 0), false),
           EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
           coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
    INTO names, fairs, capped, expired, due
    FROM pgq.queues AS q
    WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
      -- A queue with grants admits only some logins (a named one raises 42501 for the others).
      AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL));

    -- Expired leases are recovered first, so their jobs are claimable by this very claim.
    IF expired THEN
        PERFORM pgq._recover_expired(100);
    END IF;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked in name order (so claimers never deadlock) before their running
        -- jobs are counted by the next statement, whose fresh snapshot sees every earlier claim.
        -- (Under REPEATABLE READ or SERIALIZABLE that count would come from an older snapshot and
        -- could pass the cap: such a claim of a capped queue is refused.)
        PERFORM FROM pgq.queues AS q
        WHERE q.max_running > 0 AND NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
          AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL))
        ORDER BY q.name
        FOR NO KEY UPDATE;
        IF FOUND AND current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;

        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name)
        INTO names, rooms, fairs
        FROM (
            SELECT q.name, q.fair,
                   CASE WHEN q.max_running = 0 THEN claim.batch
                        ELSE least(claim.batch, q.max_running - (
                                 SELECT count(*) FROM pgq.jobs AS j
                                 WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                   END AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
              AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL))
        ) AS e
        WHERE e.room > 0;
    END IF;

    -- Then the due schedules of these queues fire (at most 10 per claim; a sweep fires the rest),
    -- after the capped queues are locked: the firing only ever skips locked queue rows, so a
    -- claim waits for queue locks in name order alone. Under REPEATABLE READ a claim leaves them
    -- to READ COMMITTED claims and sweeps: its snapshot could make a concurrent firing a
    -- serialization failure of the claim.
    IF due AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._fire_schedules(10, due_queues);
    END IF;

    IF true = ANY (fairs) THEN
        fair_ids := ARRAY(SELECT f.id
                          FROM unnest(names, rooms, fairs) AS e(name, room, fair)
                          CROSS JOIN LATERAL pgq._fair_pick(e.name, e.room, claim.kinds) AS f(id)
                          WHERE e.fair);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- For each eligible queue, its first claimable jobs in index order (up to its room);
        -- with the fair queues' picks, the best `batch` of those across queues.
        SELECT c.id
        FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs) AS e(queue, room, fair)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair AND claim.kinds IS NULL
            UNION ALL
            -- The same per (queue, kind) when the worker named its kinds (each kind once; no
            -- rows for NULL). Inside this one statement: a query of its own would cost a claim
            -- more than the per-kind picks do.
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs) AS e(queue, room, fair)
            CROSS JOIN (SELECT DISTINCT w.kind FROM unnest(claim.kinds) AS w(kind)) AS k
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue AND j.kind = k.kind
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair
            UNION ALL
            SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (fair_ids)
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT claim.batch
    ), claimed AS (
        UPDATE pgq.jobs AS j
        SET state = 'running',
            -- The next number, past any a fence move skipped (attempt_skip is 0 but after a promotion).
            attempt = j.attempt + 1 + j.attempt_skip,
            max_attempts = j.max_attempts + j.attempt_skip,
            attempt_offset = j.attempt_offset + j.attempt_skip,
            attempt_skip = 0,
            lease_until = least(pgq._now() + coalesce(claim.lease, q.lease),
                                pgq._now() + coalesce(j.max_run_time, q.max_run_time)),
            deadline = pgq._now() + coalesce(j.max_run_time, q.max_run_time),
            claimed_by = claim.worker,
            claimed_at = pgq._now(),
            session_role = session_user,
            last_event = 'claimed'
        FROM pgq.queues AS q
        -- The picked ids as an array: the generic plan then reads them by primary key. Joined
        -- to the CTE instead, it hashed the CTE and read the whole table (every row ever
        -- enqueued and not yet pruned) on every claim.
        WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p)) AND q.name = j.queue
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

CREATE OR REPLACE FUNCTION pgq.renew(id bigint, attempt integer, lease interval DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_lease timestamptz;
BEGIN
    PERFORM pgq._check_fence(renew.id, renew.attempt);
    IF renew.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', renew.lease, interval '1 day');
    END IF;
    -- Never past the attempt's deadline; at the deadline there is no lease left to give.
    UPDATE pgq.jobs AS j
    SET lease_until = least(pgq._now() + coalesce(renew.lease,
                                                  (SELECT q.lease FROM pgq.queues AS q WHERE q.name = j.queue)),
                            j.deadline)
    WHERE j.id = renew.id AND j.attempt = renew.attempt AND j.state = 'running'
      AND (j.deadline IS NULL OR j.deadline > pgq._now()) AND pgq._owns(j.session_role)
    RETURNING j.lease_until INTO new_lease;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM pgq.jobs AS j
                                 WHERE j.id = renew.id AND j.attempt = renew.attempt
                                   AND j.state = 'running' AND j.deadline <= pgq._now()
                                   AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._reject(renew.id, renew.attempt, 'renew');
    END IF;
    RETURN new_lease;
END
$$;
COMMENT ON FUNCTION pgq.renew(bigint, integer, interval) IS
    'Extends the lease of the caller''s attempt from the database clock, never past its deadline; '
    'NULL when not yours or at the deadline.';

CREATE OR REPLACE FUNCTION pgq.complete(id bigint, attempt integer, result jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    IF complete.id IS NULL OR complete.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(complete.id, complete.attempt);
    END IF;
    IF pg_column_size(complete.result) > 1048576 THEN
        PERFORM pgq._bad_argument('result',
            format('is %s bytes; the limit is 1048576 (1 MiB)', pg_column_size(complete.result)),
            'Store large results in a table of your own.');
    END IF;
    WITH completed AS (
        UPDATE pgq.jobs AS j
        SET state = 'done', result = complete.result, lease_until = NULL, finished_at = pgq._now(),
            last_event = 'completed', session_role = session_user
        WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM completed;
    IF changed > 0 THEN
        RETURN true;
    END IF;
    -- Idempotent: the same attempt already completed it (a retry after an ambiguous commit), by
    -- this login.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'done'
                 AND j.last_event = 'completed' AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(complete.id, complete.attempt, 'complete');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.complete(bigint, integer, jsonb) IS
    'Marks the caller''s attempt done; false when not yours. Repeating it returns true again.';

CREATE OR REPLACE FUNCTION pgq.complete_many(ids bigint[], attempts integer[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    -- The custom plan of the completing statement cost a re-plan per call (1.6 ms of a 4-job
    -- call here, 0.7 ms with the generic plan, which reads every pair by primary key).
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    done_ids bigint[];
BEGIN
    IF complete_many.ids IS NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not be NULL');
    ELSIF complete_many.attempts IS NULL THEN
        PERFORM pgq._bad_argument('attempts', 'must not be NULL');
    ELSIF cardinality(complete_many.ids) <> cardinality(complete_many.attempts) THEN
        PERFORM pgq._bad_argument('attempts',
            format('must have as many elements as ids (%s), got %s',
                   cardinality(complete_many.ids), cardinality(complete_many.attempts)));
    ELSIF array_position(complete_many.ids, NULL) IS NOT NULL
          OR array_position(complete_many.attempts, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not contain NULL (nor may attempts)');
    END IF;

    WITH wanted AS (
        SELECT w.id, w.attempt FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
    ), owned AS (
        -- Lock in id order, so concurrent batches never deadlock.
        SELECT j.id
        FROM pgq.jobs AS j JOIN wanted AS w ON w.id = j.id AND w.attempt = j.attempt
        WHERE j.state = 'running' AND pgq._owns(j.session_role)
        ORDER BY j.id
        FOR NO KEY UPDATE OF j
    ), completed AS (
        UPDATE pgq.jobs AS j
        SET state = 'done', lease_until = NULL, finished_at = pgq._now(), last_event = 'completed',
            session_role = session_user
        FROM owned AS o, wanted AS w
        WHERE j.id = o.id AND w.id = j.id AND j.attempt = w.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT coalesce(array_agg(c.id), '{}') INTO done_ids FROM completed AS c;
    -- The common case ends here: every pair was still ours and is done now.
    IF cardinality(done_ids) = cardinality(complete_many.ids) THEN
        RETURN QUERY SELECT unnest(done_ids);
        RETURN;
    END IF;

    -- Some pair was not completed just now. This statement sees the rows completed above, so
    -- a pair counts as ours when its job is done by that same attempt: completed above, or
    -- earlier (idempotent: a retry after an ambiguous commit). The other pairs are stale: they
    -- leave the trace a rejected pgq.complete leaves, so that a duplicate execution can be
    -- diagnosed from pgq.job_events whichever call the worker used.
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT j.id, w.attempt, NULL, 'rejected', j.state, NULL,
           format('complete_many from attempt %s rejected: the job is %s at attempt %s (last claimed by %s%s)',
                  w.attempt, j.state, j.attempt, j.claimed_by,
                  CASE WHEN NOT pgq._same_login(j.session_role) THEN ', login ' || j.session_role END)
    FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
    JOIN pgq.jobs AS j ON j.id = w.id AND j.id = ANY (complete_many.ids)
    JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE NOT (j.attempt = w.attempt AND j.state = 'done' AND j.last_event = 'completed'
               AND pgq._same_login(j.session_role));

    -- The ids drive both statements by primary key (= ANY): a join to the pairs let the generic
    -- plan read every finished job through jobs_finished_idx instead.
    RETURN QUERY
    SELECT unnest(done_ids)
    UNION
    SELECT j.id
    FROM pgq.jobs AS j
    WHERE j.id = ANY (complete_many.ids) AND j.state = 'done' AND j.last_event = 'completed'
      AND pgq._same_login(j.session_role)
      AND (j.id, j.attempt) IN (SELECT w.id, w.attempt
                                FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt));
END
$$;
COMMENT ON FUNCTION pgq.complete_many(bigint[], integer[]) IS
    'Completes each (id, attempt) pair the caller still owns; returns the ids completed.';

CREATE OR REPLACE FUNCTION pgq.fail(id bigint, attempt integer, error text, retry_in interval DEFAULT NULL,
                         retryable boolean DEFAULT true)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_state pgq.job_state;
    stored_error text := left(fail.error, 65536);
BEGIN
    IF fail.id IS NULL OR fail.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(fail.id, fail.attempt);
    END IF;
    IF fail.error IS NULL THEN
        PERFORM pgq._bad_argument('error', 'must not be NULL', 'Say why the attempt failed.');
    END IF;
    IF fail.retryable IS NULL THEN
        PERFORM pgq._bad_argument('retryable', 'must not be NULL');
    END IF;
    IF fail.retry_in IS NOT NULL THEN
        PERFORM pgq._check_interval('retry_in', fail.retry_in, interval '365 days');
    END IF;

    WITH failed AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                         THEN 'failed' ELSE 'pending' END::pgq.job_state,
            run_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN j.run_at
                          ELSE pgq._now() + coalesce(fail.retry_in,
                                   pgq._backoff(j.attempt - j.attempt_offset, q.backoff_base, q.backoff_cap)) END,
            finished_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                               THEN pgq._now() END,
            last_error = stored_error,
            last_event = 'failed',
            session_role = session_user,
            lease_until = NULL
        FROM pgq.queues AS q
        WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND q.name = j.queue
        RETURNING j.id, j.attempt, j.claimed_by, j.state, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT f.id, f.attempt, f.claimed_by, 'failed', 'running', f.state, left(stored_error, 1000)
        FROM failed AS f WHERE f.audit
    )
    SELECT f.state INTO new_state FROM failed AS f;
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    -- Idempotent: this attempt already failed (a retry after an ambiguous commit).
    SELECT j.state INTO new_state FROM pgq.jobs AS j
    WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.last_event = 'failed'
      AND pgq._same_login(j.session_role);
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    PERFORM pgq._reject(fail.id, fail.attempt, 'fail');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.fail(bigint, integer, text, interval, boolean) IS
    'Records a failed attempt: pending again after a backoff, or failed when attempts are '
    'exhausted or retryable is false. Returns the new state, NULL when not yours.';

-- Gives back a job the worker has not started (e.g. at shutdown): pending again now, without
-- using up an attempt (max_attempts is raised by one, since the attempt number never decreases).
CREATE OR REPLACE FUNCTION pgq.release(id bigint, attempt integer)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM pgq._check_fence(release.id, release.attempt);
    WITH released AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now(),
            max_attempts = j.max_attempts + 1, last_event = 'released', session_role = session_user
        WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT r.id, r.attempt, r.claimed_by, 'released', 'running', 'pending'
        FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM released;
    IF changed > 0 THEN
        PERFORM pgq._notify(j.queue) FROM pgq.jobs AS j WHERE j.id = release.id;
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.last_event = 'released'
                 AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(release.id, release.attempt, 'release');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.release(bigint, integer) IS
    'Gives an unstarted job back (pending now, the attempt not counted); false when not yours.';

-- Puts a job back to sleep for `delay`; the snooze does not use up an attempt.
CREATE OR REPLACE FUNCTION pgq.snooze(id bigint, attempt integer, delay interval)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_run_at timestamptz;
BEGIN
    PERFORM pgq._check_fence(snooze.id, snooze.attempt);
    PERFORM pgq._check_interval('delay', snooze.delay, interval '365 days');
    WITH snoozed AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now() + snooze.delay,
            max_attempts = j.max_attempts + 1, last_event = 'snoozed', session_role = session_user
        WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.run_at
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT s.id, s.attempt, s.claimed_by, 'snoozed', 'running', 'pending',
               format('until %s', s.run_at)
        FROM snoozed AS s JOIN pgq.queues AS q ON q.name = s.queue AND q.audit
    )
    SELECT s.run_at INTO new_run_at FROM snoozed AS s;
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    SELECT j.run_at INTO new_run_at FROM pgq.jobs AS j
    WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.last_event = 'snoozed'
      AND pgq._same_login(j.session_role);
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    PERFORM pgq._reject(snooze.id, snooze.attempt, 'snooze');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.snooze(bigint, integer, interval) IS
    'Pending again after delay without using an attempt; returns the new run_at, NULL when not yours.';

-- The outside effect's outcome is unknown (a timeout after the request was sent, say): park the
-- job instead of retrying blindly. pgq.resolve settles it once someone knows.
CREATE OR REPLACE FUNCTION pgq.mark_unknown(id bigint, attempt integer, note text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM pgq._check_fence(mark_unknown.id, mark_unknown.attempt);
    IF mark_unknown.note IS NULL THEN
        PERFORM pgq._bad_argument('note', 'must not be NULL', 'Say what is unknown and how to find out.');
    END IF;
    WITH marked AS (
        UPDATE pgq.jobs AS j
        SET state = 'outcome_unknown', lease_until = NULL, last_error = left(mark_unknown.note, 65536),
            last_event = 'marked_unknown', session_role = session_user
        WHERE j.id = mark_unknown.id AND j.attempt = mark_unknown.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT m.id, m.attempt, m.claimed_by, 'marked_unknown', 'running', 'outcome_unknown',
               left(mark_unknown.note, 1000)
        FROM marked AS m JOIN pgq.queues AS q ON q.name = m.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM marked;
    IF changed > 0 THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = mark_unknown.id AND j.attempt = mark_unknown.attempt
                 AND j.last_event = 'marked_unknown' AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(mark_unknown.id, mark_unknown.attempt, 'mark_unknown');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.mark_unknown(bigint, integer, text) IS
    'Parks the caller''s attempt as outcome_unknown; false when not yours.';

-- Records a checkpoint of the caller's attempt: a JSON object (at most 1 MiB) that replaces the
-- previous one and survives retries (pgq.claim hands it to the next attempt). Fenced like
-- pgq.complete; writes no event (a job may record progress often).
CREATE OR REPLACE FUNCTION pgq.progress(id bigint, attempt integer, progress jsonb)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._check_fence(progress.id, progress.attempt);
    PERFORM pgq._check_payload('progress', progress.progress);
    UPDATE pgq.jobs AS j
    SET progress = progress.progress
    WHERE j.id = progress.id AND j.attempt = progress.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role);
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(progress.id, progress.attempt, 'progress');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.progress(bigint, integer, jsonb) IS
    'Stores the caller''s attempt''s checkpoint on the job (kept across retries); false when not yours.';

-- Health: one row per finding, for dashboards, alerts and readiness probes (pgq-thin doctor).
-- severity: ok, warning or critical. The thresholds are arguments so operators (and tests) can
-- tighten them. Session checks read pg_stat_activity: the schema owner needs the pg_monitor role
-- (or to be a superuser) to see other roles' sessions.
CREATE OR REPLACE FUNCTION pgq.health(max_snapshot_age interval DEFAULT '5 minutes',
                           max_ready_age interval DEFAULT '5 minutes')
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
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

    -- 2b. A kind whose due jobs wait much longer than the rest of its queue while workers claim
    -- the queue's other kinds: no running worker handles it (a Worker claims only the kinds it has
    -- handlers for). "Much longer": past half of max_ready_age, and ten times the oldest due job of
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
        WHERE pgq._now() - d.oldest > health.max_ready_age / 2
          AND (EXISTS (SELECT FROM pgq.jobs AS w
                       WHERE w.lease_until IS NOT NULL AND w.queue = d.queue AND w.kind <> d.kind
                         AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM pgq.jobs AS w
                          WHERE w.state IN ('done', 'failed', 'cancelled') AND w.finished_at > d.oldest
                            AND w.queue = d.queue AND w.kind <> d.kind AND w.claimed_at > d.oldest))
        ORDER BY d.queue, d.kind
    LOOP
        CONTINUE WHEN r.age <= r.others * 10;
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'unclaimed_kind',
            format('queue %s: %s due job(s) of kind %s have waited up to %s while workers claim its other '
                   'kinds (whose due jobs waited at most %s)', r.queue, r.n, r.kind,
                   date_trunc('second', r.age), date_trunc('second', r.others)),
            'No running worker handles this kind: start one that does, or cancel these jobs.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'unclaimed_kind', 'no kind waits much longer than the rest of its queue', NULL::text;
    END IF;

    -- 3. Jobs parked as outcome_unknown wait for a person.
    SELECT count(*) AS n, min(j.claimed_at) AS oldest INTO r
    FROM pgq.jobs AS j WHERE j.state = 'outcome_unknown';
    IF r.n = 0 THEN
        RETURN QUERY SELECT 'ok', 'outcome_unknown', 'no job waits for a decision', NULL::text;
    ELSE
        RETURN QUERY SELECT 'warning', 'outcome_unknown',
            format('%s job(s) in outcome_unknown, the oldest claimed %s ago', r.n,
                   date_trunc('second', pgq._now() - r.oldest)),
            'Find out what happened, then pgq.resolve(id, ''done'' | ''pending'' | ''failed'' | ''cancelled'').';
    END IF;

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
            CASE WHEN r.waited > health.max_snapshot_age THEN 'critical' ELSE 'warning' END,
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
          AND clock_timestamp() - a.xact_start > health.max_snapshot_age / 2
        ORDER BY a.xact_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            CASE WHEN r.state LIKE 'idle in transaction%' THEN 'idle_in_transaction' ELSE 'long_transaction' END,
            format('pid %s (%s, %s) has held a snapshot for %s (xmin age %s transactions): %s', r.pid,
                   r.usename, r.state, date_trunc('second', r.age), r.xmin_age, r.query),
            'It holds back vacuum: end it, and set idle_in_transaction_session_timeout / statement_timeout.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'oldest_snapshot',
            format('no snapshot older than %s', health.max_snapshot_age / 2), NULL::text;
    END IF;

    -- 6. Dead tuples and vacuum of pgq's tables; index sizes, for the record.
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
    'waiting jobs, kinds no worker claims, outcome_unknown jobs, blocked sessions, old snapshots, dead '
    'tuples, index sizes.';

-- One job, as stored: what an operator needs before cancel, retry or resolve. P0002 when unknown.
CREATE OR REPLACE FUNCTION pgq.get_job(id bigint)
    RETURNS pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF get_job.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = get_job.id;
    -- A job of a queue the login may not read is answered as if there were none.
    IF NOT FOUND OR NOT pgq._may_read(job.queue) THEN
        RAISE EXCEPTION 'pgq: no job with id %', get_job.id
            USING ERRCODE = 'no_data_found', HINT = 'It may have been pruned.';
    END IF;
    RETURN job;
END
$$;
COMMENT ON FUNCTION pgq.get_job(bigint) IS 'The job row; P0002 when there is no such job.';

-- A job's attempt history, oldest first (empty when its queue has audit off, or it was pruned).
CREATE OR REPLACE FUNCTION pgq.job_history(id bigint)
    RETURNS SETOF pgq.job_events
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    IF job_history.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    IF NOT pgq._may_read((SELECT j.queue FROM pgq.jobs AS j WHERE j.id = job_history.id)) THEN
        RETURN;  -- a job of a queue the login may not read has no history it can see
    END IF;
    RETURN QUERY SELECT * FROM pgq.job_events AS e WHERE e.job_id = job_history.id ORDER BY e.id;
END
$$;
COMMENT ON FUNCTION pgq.job_history(bigint) IS
    'The events of one job (claims, transitions, rejected stale writes), oldest first.';

-- Operators find jobs here: newest first (by id), keyset-paged (pass the last id of a page as
-- before_id for the next), filtered by queue, state and kind. A page reads at most limit_rows rows
-- per (queue, state) through jobs_list_idx (keyed by -id), and the running jobs through
-- jobs_lease_idx, however much finished history the table holds; kind is a filter within those
-- (a rare kind among many jobs of its queue and state reads past the others). An unknown queue or state
-- is refused (22023), like a malformed kind.
CREATE OR REPLACE FUNCTION pgq.list_jobs(queue text DEFAULT NULL, state text DEFAULT NULL, kind text DEFAULT NULL,
                              limit_rows integer DEFAULT 50, before_id bigint DEFAULT NULL)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    SET jit = off
    AS $$
DECLARE
    states pgq.job_state[] := enum_range(NULL::pgq.job_state);
    below  bigint := coalesce(list_jobs.before_id, 9223372036854775807);
    hidden text[];  -- the queues whose jobs this login may not read
    named  pgq.queues;
BEGIN
    IF list_jobs.state IS NOT NULL THEN
        IF NOT list_jobs.state = ANY (states::text[]) THEN
            PERFORM pgq._bad_argument('state', format('must be one of %s, got %s',
                array_to_string(states, ', '), left(quote_literal(list_jobs.state), 40)));
        END IF;
        states := ARRAY[list_jobs.state::pgq.job_state];
    END IF;
    IF list_jobs.queue IS NOT NULL THEN
        named := pgq._existing_queue('queue', list_jobs.queue);
        IF NOT pgq._may(named.name, named.restricted, 'read') THEN
            PERFORM pgq._denied(named.name, 'read');
        END IF;
    END IF;
    hidden := ARRAY(SELECT h.name FROM pgq.queues AS h
                    WHERE h.restricted IS NOT NULL AND NOT pgq._may(h.name, h.restricted, 'read'));
    IF list_jobs.kind IS NOT NULL THEN
        PERFORM pgq._check_name('kind', list_jobs.kind);
    END IF;
    IF list_jobs.limit_rows IS NULL THEN
        PERFORM pgq._bad_argument('limit_rows', 'must not be NULL');
    ELSIF list_jobs.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows', format('must be between 1 and 1000, got %s', list_jobs.limit_rows));
    END IF;

    RETURN QUERY
    SELECT p.*
    FROM (
        SELECT c.*
        FROM pgq.queues AS q
        CROSS JOIN unnest(states) AS s(state)
        CROSS JOIN LATERAL (
            SELECT j.*
            FROM pgq.jobs AS j
            WHERE j.queue = q.name AND j.state = s.state AND j.state <> 'running' AND -j.id > -below
              AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
            ORDER BY -j.id
            LIMIT list_jobs.limit_rows
        ) AS c
        WHERE (list_jobs.queue IS NULL OR q.name = list_jobs.queue) AND s.state <> 'running'
          AND q.name <> ALL (hidden)
        UNION ALL
        SELECT j.*
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL AND j.state = 'running' AND 'running' = ANY (states)
          AND j.id < below
          AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
          AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
          AND j.queue <> ALL (hidden)
    ) AS p
    ORDER BY p.id DESC
    LIMIT list_jobs.limit_rows;
END
$$;
COMMENT ON FUNCTION pgq.list_jobs(text, text, text, integer, bigint) IS
    'Jobs newest first (by id), filtered by queue, state and kind; at most limit_rows, all older than '
    'before_id when given (keyset paging).';

-- The schema version: the number of the newest migration. Every migration redefines it (and
-- tests/test_schema_matches_migrations.py checks that it names the newest migration file).
CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '8'::text $$;
COMMENT ON FUNCTION pgq.version() IS
    'The version of the installed pgq schema: the number of the newest migration applied.';

CREATE OR REPLACE FUNCTION pgq.schedules()
    RETURNS SETOF pgq.schedules
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    -- (Not the schedules of a queue whose read grants do not admit the login: their payloads are
    -- the queue's future jobs.)
    SELECT * FROM pgq.schedules AS x WHERE pgq._may_read(x.queue) ORDER BY x.name
$$;
COMMENT ON FUNCTION pgq.schedules() IS
    'Every schedule, by name, with next_run_at, last_run_at, last_job_id and skipped.';

-- Grants -----------------------------------------------------------------------------------------

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgq.grant_queue(text, text, text),
    pgq.revoke_queue(text, text, text)
    TO pgq_admin;
GRANT EXECUTE ON FUNCTION pgq.queue_grants(text) TO pgq_monitor;
