-- 0026: the registry of live workers (issue 41). The functions are the function source's
-- (sql/functions/registry.sql says how a worker announces itself, heartbeats and leaves, and who
-- sees which entries); this versions what they read:
--
-- * pgq.worker_registry: one row per worker that heartbeats (pgq.worker_heartbeat), keyed by the
--   login that sent it (session_user) and the worker's name, so that no login can write, refresh or
--   remove another login's entry; what it claims (queues, kinds), how many jobs it runs, where it
--   runs (host, pid), when it started, was last seen and stops counting as alive. The sweep deletes
--   the entries an hour past their alive_until; until then pgq.health names the running jobs of a
--   worker that stopped heartbeating.
--
-- A new table only: nothing that exists is locked.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.worker_registry (
    login       text        NOT NULL,
    worker      text        NOT NULL,
    host        text,
    pid         integer,
    queues      text[],
    kinds       text[],
    running     integer     NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    alive_until timestamptz NOT NULL,
    CONSTRAINT worker_registry_pkey PRIMARY KEY (login, worker)
);
COMMENT ON TABLE pgq.worker_registry IS
    'The workers that heartbeat (pgq.worker_heartbeat), one row per login and worker name; '
    'pgq.workers() lists the live ones. Deleted by the sweep an hour after alive_until.';
COMMENT ON COLUMN pgq.worker_registry.login IS 'The login that sent the heartbeats (session_user).';
COMMENT ON COLUMN pgq.worker_registry.queues IS 'The queues it claims from; NULL: all.';
COMMENT ON COLUMN pgq.worker_registry.kinds IS 'The kinds it claims; NULL: any.';
COMMENT ON COLUMN pgq.worker_registry.alive_until IS
    'The last heartbeat''s time plus its alive_for: a worker not heard of since is not alive.';
CREATE INDEX worker_registry_alive_idx ON pgq.worker_registry (alive_until);
COMMENT ON INDEX pgq.worker_registry_alive_idx IS
    'The entries by alive_until: the live ones (pgq.workers, pgq.health) and the stale ones the sweep deletes.';
