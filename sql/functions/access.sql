-- sql/functions/access.sql: who may act: the login a job is bound to, and per-queue grants
-- (enqueue, claim, read, signal).

-- A job is bound to the database login that claimed it (session_user, kept in
-- jobs.session_role): worker names are whatever a caller says, logins are what PostgreSQL
-- authenticated. The owner operations accept a running attempt's writes only from that login or
-- from a member of pgq_admin, and recognise a repeated call only from the login that made it.
-- Per-queue grants (pgq.grants, pgq.signal_grants) restrict enqueue, claim, read and signal per
-- queue. Both are decided on session_user, not current_user: inside these SECURITY DEFINER
-- functions current_user is the schema's owner, and a SET ROLE does not change who logged in.

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
-- of pgq_admin. The grants of signal are pgq.signal_grants'.
CREATE OR REPLACE FUNCTION pgq._may(queue text, restricted text[], privilege text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT _may.restricted IS NULL OR NOT _may.privilege = ANY (_may.restricted)
        OR pg_has_role(session_user, 'pgq_admin', 'MEMBER')
        OR EXISTS (SELECT FROM pgq.grants AS g
                   WHERE g.queue = _may.queue
                     AND (g.privilege = _may.privilege OR (_may.privilege = 'read' AND g.privilege = 'claim'))
                     AND pg_has_role(session_user, g.role, 'MEMBER'))
        OR _may.privilege = 'signal'
           AND EXISTS (SELECT FROM pgq.signal_grants AS g
                       WHERE g.queue = _may.queue AND pg_has_role(session_user, g.role, 'MEMBER'))
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
        CASE _denied.privilege WHEN 'enqueue' THEN 'enqueue into' WHEN 'claim' THEN 'claim from'
                               WHEN 'signal' THEN 'signal' ELSE 'read' END,
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
        SELECT g.role INTO role_oid
        FROM (SELECT x.queue, x.role FROM pgq.grants AS x UNION ALL SELECT y.queue, y.role FROM pgq.signal_grants AS y) AS g
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
    ELSIF _grant_target.privilege NOT IN ('enqueue', 'claim', 'read', 'signal') THEN
        PERFORM pgq._bad_argument('privilege',
            format('must be one of enqueue, claim, read, signal, got %s', left(quote_literal(_grant_target.privilege), 40)));
    END IF;
    PERFORM pgq._lock_queue(_grant_target.queue);  -- at most lock_timeout (5 s), then 55P03
    RETURN role_oid;
END
$$;

-- Keeps queues.restricted equal to the privileges that have grants on the queue.
CREATE OR REPLACE FUNCTION pgq._refresh_restricted(queue text) RETURNS text[]
    LANGUAGE sql
    AS $$
    UPDATE pgq.queues AS q
    SET restricted = (SELECT array_agg(DISTINCT g.privilege ORDER BY g.privilege)
                      FROM (SELECT x.privilege FROM pgq.grants AS x WHERE x.queue = _refresh_restricted.queue
                            UNION ALL
                            SELECT 'signal' FROM pgq.signal_grants AS y WHERE y.queue = _refresh_restricted.queue) AS g)
    WHERE q.name = _refresh_restricted.queue
    RETURNING q.restricted
$$;

-- Lets the members of `role` use `privilege` (enqueue, claim, read or signal) on an existing queue. The
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
    IF grant_queue.privilege = 'signal' THEN
        INSERT INTO pgq.signal_grants AS g (queue, role) VALUES (grant_queue.queue, role_oid) ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO pgq.grants AS g (queue, privilege, role)
        VALUES (grant_queue.queue, grant_queue.privilege, role_oid)
        ON CONFLICT DO NOTHING;
    END IF;
    added := FOUND;
    PERFORM pgq._refresh_restricted(grant_queue.queue);
    RETURN added;
END
$$;
COMMENT ON FUNCTION pgq.grant_queue(text, text, text) IS
    'Lets members of role enqueue into, claim from, read or signal (privilege) the queue; once a queue has a '
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
    IF revoke_queue.privilege = 'signal' THEN
        DELETE FROM pgq.signal_grants AS g WHERE g.queue = revoke_queue.queue AND g.role = role_oid;
    ELSE
        DELETE FROM pgq.grants AS g
        WHERE g.queue = revoke_queue.queue AND g.privilege = revoke_queue.privilege AND g.role = role_oid;
    END IF;
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
    FROM (SELECT x.queue, x.privilege, x.role, x.granted_at, x.granted_by FROM pgq.grants AS x
          UNION ALL
          SELECT y.queue, 'signal', y.role, y.granted_at, y.granted_by FROM pgq.signal_grants AS y) AS g
    LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = g.role
    WHERE queue_grants.queue IS NULL OR g.queue = queue_grants.queue
    ORDER BY 1, 2, 3;
$$;
COMMENT ON FUNCTION pgq.queue_grants(text) IS
    'The per-queue grants (of one queue, or all): queue, privilege, role, when and by whom.';
