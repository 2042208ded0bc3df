-- pgq: a SQL-first PostgreSQL job queue.
--
-- This file is the canonical, current definition of the pgq schema: what a reader opens to
-- understand pgq. It is applied by hand to a fresh database (psql -f sql/schema.sql) or reached
-- through the yoyo migrations in migrations/; tests/test_schema_matches_migrations.py requires
-- both to produce the same catalog.
--
-- Where is a job claimed? In pgq.claim, below. Where is a write fenced? In every owner
-- operation (renew, complete, complete_many, fail, release, snooze, mark_unknown, progress): each
-- one matches id AND attempt AND state = 'running' in the UPDATE itself. Where does a schedule
-- fire? In pgq._fire_schedules, called by pgq.claim (behind a probe) and pgq.sweep. Where does an
-- attempt time out? Its lease never passes its deadline (claim, renew); the recovery of expired
-- leases (pgq._recover_expired) ends it.
--
-- Error contract (documented in docs/sql-api.md):
--   22004 null_value_not_allowed           a required argument is NULL
--   22023 invalid_parameter_value          an argument is out of range or malformed
--   P0002 no_data_found                    an admin call names a job that does not exist
--   55000 object_not_in_prerequisite_state an admin call on a job in the wrong state
--   42501 insufficient_privilege           a queue's grants (pgq.grant_queue) do not admit the login
--   55P03 lock_not_available               an admin call waited its lock_timeout (5 s) for a lock
--   54000 program_limit_exceeded           a job was released or snoozed past its attempt room
-- Owner operations never raise for lost ownership: they answer false / NULL ("not yours"), also
-- to a login other than the one that claimed the job (see pgq._owns).

CREATE SCHEMA pgq;
COMMENT ON SCHEMA pgq IS 'pgq: a SQL-first job queue. See docs/sql-api.md.';

-- Roles ------------------------------------------------------------------------------------------
-- Roles are cluster-wide: create them only where they do not exist yet, so that pgq can be
-- installed in a second database of the same cluster.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgq_producer', 'pgq_worker', 'pgq_admin', 'pgq_monitor'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
    -- An admin can do what the others can.
    FOREACH r IN ARRAY ARRAY['pgq_producer', 'pgq_worker', 'pgq_monitor'] LOOP
        IF NOT pg_catalog.pg_has_role('pgq_admin', r, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO pgq_admin', r);
        END IF;
    END LOOP;
END
$roles$;

-- Types ------------------------------------------------------------------------------------------

CREATE TYPE pgq.job_state AS ENUM (
    'waiting',          -- enqueued with depends_on: until its dependencies are done (then pending)
    'pending',          -- waiting for run_at, then for a worker
    'running',          -- claimed: owned by attempt `attempt` until lease_until
    'done',             -- completed by its owner (terminal)
    'failed',           -- attempts exhausted or not retryable; last_error keeps the reason (terminal)
    'cancelled',        -- cancelled by an admin (terminal)
    'outcome_unknown'   -- the outside effect may or may not have happened: parked until pgq.resolve
);
COMMENT ON TYPE pgq.job_state IS
    'The life cycle of a job. done, failed and cancelled are terminal; waiting: enqueued with '
    'depends_on, until its dependencies are done.';

-- What an interval argument or setting may be: a span of days and time, of one sign. An interval
-- that counts months ('3000000 mon -89999999 days' compares as 1 day, since a comparison counts a
-- month as 30 days, but adds 1.3 million days to a timestamp) or mixes the signs of its days and
-- its time ('1 day -23:59:59', 1 second by comparison, is -59:59 on a 23-hour day) does not do to
-- a timestamp what its comparison with a cap says; one without both does, give or take the hour a
-- daylight saving change adds to or takes from a day. One expression: inlined where it is used.
CREATE FUNCTION pgq._is_span(interval) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT extract(year FROM $1) = 0 AND extract(month FROM $1) = 0
           AND extract(day FROM $1) * (extract(epoch FROM $1) - 86400 * extract(day FROM $1)) >= 0
$$;
COMMENT ON FUNCTION pgq._is_span(interval) IS
    'Whether an interval counts no months or years and its days and time have the same sign.';

-- Tables -----------------------------------------------------------------------------------------

CREATE TABLE pgq.queues (
    name          text        PRIMARY KEY,
    paused        boolean     NOT NULL DEFAULT false,
    lease         interval    NOT NULL DEFAULT '30 seconds',
    max_attempts  integer     NOT NULL DEFAULT 25,
    backoff_base  interval    NOT NULL DEFAULT '1 second',
    backoff_cap   interval    NOT NULL DEFAULT '1 hour',
    retention     interval    NOT NULL DEFAULT '7 days',
    notify        boolean     NOT NULL DEFAULT true,
    audit         boolean     NOT NULL DEFAULT true,
    fair          boolean     NOT NULL DEFAULT false,
    max_running   integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    max_run_time  interval,
    next_schedule_at timestamptz,
    restricted    text[],
    key_max_running integer   NOT NULL DEFAULT 0,
    key_limited   boolean     NOT NULL DEFAULT false,
    rate_limit    integer     NOT NULL DEFAULT 0,
    rate_period   interval    NOT NULL DEFAULT '1 second',
    key_rate_limit integer    NOT NULL DEFAULT 0,
    rate_limited  boolean     NOT NULL DEFAULT false,
    rate_tat      timestamptz,
    CONSTRAINT queues_max_running_check CHECK (max_running BETWEEN 0 AND 100000),
    CONSTRAINT queues_key_max_running_check CHECK (key_max_running BETWEEN 0 AND 100000),
    CONSTRAINT queues_rate_check CHECK (rate_limit BETWEEN 0 AND 1000000 AND key_rate_limit BETWEEN 0 AND 1000000
                                        AND rate_period > '0' AND rate_period <= '1 day'
                                        AND pgq._is_span(rate_period)),
    CONSTRAINT queues_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 10000),
    CONSTRAINT queues_lease_check CHECK (lease > '0' AND lease <= '1 day' AND pgq._is_span(lease)),
    CONSTRAINT queues_backoff_check CHECK (backoff_base > '0' AND backoff_cap >= backoff_base
                                           AND backoff_cap <= '365 days'
                                           AND pgq._is_span(backoff_base) AND pgq._is_span(backoff_cap)),
    CONSTRAINT queues_retention_check CHECK (retention >= '0' AND retention <= '3650 days'
                                             AND pgq._is_span(retention)),
    CONSTRAINT queues_max_run_time_check CHECK (max_run_time > '0' AND max_run_time <= '365 days'
                                                AND pgq._is_span(max_run_time))
);
COMMENT ON TABLE pgq.queues IS
    'Per-queue settings. A row is created with these defaults on first use of a queue name.';
COMMENT ON COLUMN pgq.queues.fair IS
    'Fair mode: claims serve the queue''s tenants in weighted round-robin (see pgq.tenants).';
COMMENT ON COLUMN pgq.queues.max_running IS
    'At most this many jobs of the queue running at once across all workers; 0: no cap.';
COMMENT ON COLUMN pgq.queues.max_run_time IS
    'How long an attempt may run from its claim (jobs.max_run_time overrides it); NULL: no limit.';
COMMENT ON COLUMN pgq.queues.next_schedule_at IS
    'The earliest next_run_at of the queue''s enabled schedules (NULL: none), kept by pgq.schedule, '
    'pgq.unschedule and the firing: a claim reads it with the queue''s settings to know whether a '
    'schedule is due, at no extra cost.';
COMMENT ON COLUMN pgq.queues.restricted IS
    'The privileges (enqueue, claim, read) that have grants on this queue (pgq.grant_queue), in '
    'name order; NULL when it has none. Only a restricted queue pays for a look at pgq.grants.';
COMMENT ON COLUMN pgq.queues.key_max_running IS
    'At most this many jobs of one concurrency_key running at once (pgq.set_key_limit overrides it '
    'per key); 0: no limit. Jobs without a concurrency_key are not limited by it.';
COMMENT ON COLUMN pgq.queues.key_limited IS
    'Whether the queue limits its keys (key_max_running > 0 or a pgq.key_limits row), kept by '
    'pgq.configure_queue and pgq.set_key_limit: only such a queue''s claim takes the per-key step.';
COMMENT ON COLUMN pgq.queues.rate_limit IS
    'At most this many jobs of the queue claimed per rate_period (a burst of at most rate_limit, '
    'then rate_limit per rate_period); 0: no limit.';
COMMENT ON COLUMN pgq.queues.rate_period IS
    'The period of rate_limit and key_rate_limit.';
COMMENT ON COLUMN pgq.queues.key_rate_limit IS
    'At most this many jobs of one concurrency_key claimed per rate_period; 0: no limit. Jobs '
    'without a concurrency_key are not limited by it.';
COMMENT ON COLUMN pgq.queues.rate_limited IS
    'Whether the queue has a rate limit (rate_limit > 0 or key_rate_limit > 0), kept by '
    'pgq.configure_queue: only such a queue''s claim takes the rate step.';
COMMENT ON COLUMN pgq.queues.rate_tat IS
    'The rate limit''s state (GCRA): the moment its bucket is full again (NULL or past: full now). '
    'Written by pgq.claim under the queue''s row lock.';

-- Fair mode's bookkeeping: one row per (queue, tenant) of a fair queue. A claim serves the
-- tenants with the least virtual time first and advances a served tenant's virtual time by
-- 1/weight per job, so over time each tenant gets jobs started in proportion to its weight.
CREATE TABLE pgq.tenants (
    queue   text             NOT NULL,
    tenant  text             NOT NULL,
    weight  integer          NOT NULL DEFAULT 1,
    vtime   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant),
    CONSTRAINT tenants_weight_check CHECK (weight BETWEEN 1 AND 1000)
);
COMMENT ON TABLE pgq.tenants IS
    'The tenants of fair queues: their weight and virtual time (jobs started / weight). '
    'Jobs without a tenant in a fair queue belong to the tenant ''''.';

CREATE TABLE pgq.jobs (
    id            bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text          NOT NULL,
    kind          text          NOT NULL,
    payload       jsonb         NOT NULL DEFAULT '{}',
    priority      integer       NOT NULL DEFAULT 0,
    state         pgq.job_state NOT NULL DEFAULT 'pending',
    run_at        timestamptz   NOT NULL DEFAULT now(),
    created_at    timestamptz   NOT NULL DEFAULT now(),
    attempt       integer       NOT NULL DEFAULT 0,
    max_attempts  integer       NOT NULL,
    lease_until   timestamptz,
    claimed_by    text,
    claimed_at    timestamptz,
    last_error    text,
    result        jsonb,
    finished_at   timestamptz,
    unique_key    text,
    tenant        text,
    last_event    text          NOT NULL DEFAULT 'enqueued',
    max_run_time  interval,
    deadline      timestamptz,
    progress      jsonb,
    schedule      text,
    attempt_skip  integer       NOT NULL DEFAULT 0,
    attempt_offset integer      NOT NULL DEFAULT 0,
    session_role  text,
    meta          jsonb,
    concurrency_key text,
    depends_on    bigint[],
    dependencies_left integer,
    has_dependants boolean      NOT NULL DEFAULT false,
    -- The attempt number is the fencing token: it only grows, and never past max_attempts.
    CONSTRAINT jobs_attempt_check CHECK (attempt >= 0 AND attempt <= max_attempts),
    -- Exactly the running jobs hold a lease.
    CONSTRAINT jobs_lease_check CHECK ((state = 'running') = (lease_until IS NOT NULL))
) WITH (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
COMMENT ON TABLE pgq.jobs IS 'One row per job. Finished rows stay until pgq.prune deletes them.';
COMMENT ON COLUMN pgq.jobs.attempt IS
    'The fencing token: incremented by every claim, never decreased. Owner operations must quote it.';
COMMENT ON COLUMN pgq.jobs.meta IS
    'The producer''s metadata (enqueue''s meta; NULL: none): a JSON object kept across retries and '
    'handed to every attempt by pgq.claim. pgq_thin puts the W3C trace context under "otel".';
COMMENT ON COLUMN pgq.jobs.last_event IS
    'How the job reached its state: ''enqueued'' until its first transition, then the event name '
    'of that transition in pgq.job_events. Lets an owner operation repeated after an ambiguous '
    'commit recognise its own earlier success.';
COMMENT ON COLUMN pgq.jobs.attempt_skip IS
    'Attempt numbers the next claim skips: set when a promotion moved the job''s fence (pgq.fence).';
COMMENT ON COLUMN pgq.jobs.attempt_offset IS
    'Attempt numbers skipped by fence moves so far: attempt - attempt_offset is the number of attempts.';
COMMENT ON COLUMN pgq.jobs.session_role IS
    'The database login (session_user) of the job''s latest claim or owner operation: the owner '
    'operations of a running attempt are accepted only from this login (or a member of pgq_admin), '
    'and a repeated one is recognised only from the login that made it. NULL: claimed before 0008.';
COMMENT ON COLUMN pgq.jobs.lease_until IS
    'While running: the database time after which the job may be recovered by claim or sweep.';
COMMENT ON COLUMN pgq.jobs.max_run_time IS
    'How long an attempt of this job may run from its claim; NULL: the queue''s max_run_time.';
COMMENT ON COLUMN pgq.jobs.deadline IS
    'The latest attempt''s deadline (claimed_at + max_run_time), set by each claim; NULL: no limit. '
    'Its lease never passes it; the recovery ends the attempt as timed_out once it has.';
COMMENT ON COLUMN pgq.jobs.progress IS
    'The checkpoint the job''s attempts record with pgq.progress; kept across retries.';
COMMENT ON COLUMN pgq.jobs.schedule IS
    'The schedule (pgq.schedules.name) that enqueued this job; NULL for jobs enqueued directly.';
COMMENT ON COLUMN pgq.jobs.concurrency_key IS
    'The job''s key for per-key concurrency (queues.key_max_running, pgq.key_limits); NULL: none.';
COMMENT ON COLUMN pgq.jobs.depends_on IS
    'The jobs this one was enqueued to run after (enqueue''s depends_on: distinct, in id order); '
    'NULL: none.';
COMMENT ON COLUMN pgq.jobs.dependencies_left IS
    'While waiting: how many of depends_on are not done yet (the job becomes pending at 0); NULL '
    'for a job enqueued without depends_on.';
COMMENT ON COLUMN pgq.jobs.has_dependants IS
    'Whether a job was ever enqueued with this one in its depends_on (set by that enqueue, which '
    'locks this row so): only then does this job''s end call pgq._dependency_ended.';

CREATE TABLE pgq.job_events (
    id          bigint        GENERATED ALWAYS AS IDENTITY,
    job_id      bigint        NOT NULL,
    attempt     integer       NOT NULL,
    worker      text,
    event       text          NOT NULL,
    from_state  pgq.job_state,
    to_state    pgq.job_state,
    at          timestamptz   NOT NULL DEFAULT clock_timestamp(),
    note        text,
    session_role text         DEFAULT session_user,
    times       integer       NOT NULL DEFAULT 1,
    -- One index, read by job (history, prune) and written by every event: a second index on id
    -- alone cost about a third of the event log's write time.
    PRIMARY KEY (job_id, id)
);
COMMENT ON TABLE pgq.job_events IS
    'The attempt history: every claim and state change, and every rejected stale write (event '
    '''rejected'', to_state NULL), for queues with audit on.';
COMMENT ON COLUMN pgq.job_events.session_role IS
    'The database login (session_user) whose call caused the event; worker is the name the caller '
    'gave, which any login can give. NULL for events written before migration 0008.';
COMMENT ON COLUMN pgq.job_events.times IS
    'How many times the event happened: 1, but for a rejected write repeated (the same job, attempt '
    'and operation), which is recorded once and counted here (at is the first time).';

-- Periodic schedules: each due occurrence becomes one job (pgq._fire_schedules).
CREATE TABLE pgq.schedules (
    name             text        PRIMARY KEY,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    cron             text,
    every            interval,
    payload          jsonb       NOT NULL DEFAULT '{}',
    timezone         text        NOT NULL DEFAULT 'UTC',
    priority         integer     NOT NULL DEFAULT 0,
    max_attempts     integer,
    tenant           text,
    skip_if_running  boolean     NOT NULL DEFAULT false,
    enabled          boolean     NOT NULL DEFAULT true,
    next_run_at      timestamptz NOT NULL,
    last_run_at      timestamptz,
    last_job_id      bigint,
    last_skipped_at  timestamptz,
    skipped          bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_cron_or_every_check CHECK ((cron IS NULL) <> (every IS NULL)),
    CONSTRAINT schedules_every_check CHECK (every >= '1 second' AND every <= '3650 days'
                                            AND pgq._is_span(every))
);
COMMENT ON TABLE pgq.schedules IS
    'Periodic jobs (pgq.schedule): each occurrence due by next_run_at is enqueued once by a claim '
    'or sweep, which moves next_run_at past now.';
COMMENT ON COLUMN pgq.schedules.last_run_at IS
    'The fire time of the latest occurrence enqueued (the run_at of job last_job_id).';
COMMENT ON COLUMN pgq.schedules.skipped IS
    'Occurrences skipped by skip_if_running (the latest at last_skipped_at).';

-- The failover fence. An attempt number is a fencing token only if no server ever hands it out
-- twice. After a promotion, the new primary's jobs are a prefix of the old primary's history: with
-- asynchronous replication, attempts the old primary issued in its last moments (claims that never
-- reached the standby) are unknown here, and counting on from the attempt a job has here would
-- issue those numbers again, to a second live owner. So the first claim on a new timeline moves
-- every unfinished job's next attempt number past anything the old primary could have issued
-- (pgq._check_timeline); this table remembers the timeline the fences were last moved on.
CREATE TABLE pgq.fence (
    one          boolean     PRIMARY KEY DEFAULT true,
    timeline     integer     NOT NULL,
    moves        integer     NOT NULL DEFAULT 0,
    moved_at     timestamptz,
    jobs_moved   bigint      NOT NULL DEFAULT 0,
    CONSTRAINT fence_one_row CHECK (one)
);
COMMENT ON TABLE pgq.fence IS
    'One row: the WAL timeline on which the attempt fences were last checked and moved (see pgq.claim).';
INSERT INTO pgq.fence (timeline)
VALUES (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer);

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
-- Counters of finished jobs, for metrics: every transition into done, failed or cancelled writes a
-- row into pgq.finished_deltas (the trigger jobs_count_finished, in the transaction of the
-- transition; insert-only, so concurrent completes never wait on a counter row), and
-- pgq._fold_finished (called by pgq.metrics and pgq.sweep) moves them into pgq.finished_counts.
CREATE TABLE pgq.finished_counts (
    queue  text          NOT NULL,
    state  pgq.job_state NOT NULL,
    total  bigint        NOT NULL,
    PRIMARY KEY (queue, state)
);
COMMENT ON TABLE pgq.finished_counts IS
    'Jobs that reached done, failed or cancelled, per queue and state: those stored when migration 0010 '
    'ran, and every transition since (pgq.prune does not lower them); pgq.finished_deltas holds '
    'the ones not folded in yet.';

CREATE TABLE pgq.finished_deltas (
    queue  text          NOT NULL,
    state  pgq.job_state NOT NULL
);
COMMENT ON TABLE pgq.finished_deltas IS
    'One row per transition into a terminal state, written by the trigger jobs_count_finished and '
    'folded into pgq.finished_counts (and deleted) by pgq._fold_finished.';
-- It has no key (an index would cost every completion); REPLICA IDENTITY FULL lets the fold delete
-- its rows where a publication FOR ALL TABLES includes it (a table without a replica identity
-- refuses deletes there).
ALTER TABLE pgq.finished_deltas REPLICA IDENTITY FULL;

-- Per-key limits that override a queue's key_max_running for one key (pgq.set_key_limit): a
-- bigger customer gets 5 running jobs where the others get 2. max_running 0: this key has no limit.
CREATE TABLE pgq.key_limits (
    queue        text    NOT NULL REFERENCES pgq.queues (name) ON DELETE CASCADE,
    key          text    NOT NULL,
    max_running  integer NOT NULL,
    PRIMARY KEY (queue, key),
    CONSTRAINT key_limits_max_running_check CHECK (max_running BETWEEN 0 AND 100000)
);
COMMENT ON TABLE pgq.key_limits IS
    'Per-key overrides of queues.key_max_running (pgq.set_key_limit); 0: the key has no limit.';

-- The per-key rate limits' state (queues.key_rate_limit): one row per (queue, key) whose bucket
-- is not full, written by pgq.claim under the queue's row lock (upserted); rows whose bucket is
-- full again are deleted by pgq.sweep and pgq.prune (pgq._prune_key_rates), so the table holds
-- the keys claimed in about the last rate_period.
CREATE TABLE pgq.key_rates (
    queue text        NOT NULL REFERENCES pgq.queues (name) ON DELETE CASCADE,
    key   text        NOT NULL,
    tat   timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
COMMENT ON TABLE pgq.key_rates IS
    'Per-key rate limit state (GCRA): tat is when the key''s bucket is full again.';
-- The dependencies still open: one row per (dependency, waiting dependant), inserted by the
-- dependant's enqueue for each of its dependencies not done yet, deleted when the dependency ends
-- (done: the dependant counts one fewer; failed or cancelled: the dependant is cancelled) or the
-- dependant ends (cancelled). So it holds only the links of waiting jobs, never the history
-- (jobs.depends_on keeps that). No foreign key: it would put a trigger on every delete of pgq.jobs.
CREATE TABLE pgq.job_dependencies (
    depends_on  bigint NOT NULL,
    job_id      bigint NOT NULL,
    PRIMARY KEY (depends_on, job_id)
);
COMMENT ON TABLE pgq.job_dependencies IS
    'The open dependencies of waiting jobs: job_id waits for depends_on (pgq.enqueue''s depends_on); '
    'a row goes when either job ends.';

-- Indexes ----------------------------------------------------------------------------------------

-- A fair queue's claim walks its tenants by virtual time (pgq._fair_pick), reading only as many as
-- it serves, however many tenants have due jobs.
CREATE INDEX tenants_vtime_idx ON pgq.tenants (queue, vtime, tenant);

-- A claim of every queue finds the queues with a due schedule here, not by reading every queue.
CREATE INDEX queues_schedule_due_idx ON pgq.queues (next_schedule_at) WHERE next_schedule_at IS NOT NULL;

-- The claim walks this index in the total order priority DESC, run_at, id, one queue at a time.
-- The predicate is repeated word for word in pgq.claim so the planner can use it.
CREATE INDEX jobs_ready_idx ON pgq.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts;

-- Fair mode walks each tenant's claimable jobs in the total order. Only jobs with a tenant pay for
-- this index; a fair queue stores '' for a job enqueued without one.
CREATE INDEX jobs_tenant_ready_idx ON pgq.jobs (queue, tenant, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts AND tenant IS NOT NULL;

-- Expired-lease recovery (sweep, and the probe in claim) reads running jobs by lease_until.
-- The predicate selects exactly the running jobs (jobs_lease_check), but is not spelled
-- `state = 'running'`: the owner operations' fence (id AND attempt AND state = 'running') would
-- then imply it, and a partial index whose predicate a query implies may be read whole. With
-- statistics that say few jobs are running (they were gathered in a quiet moment), the planner
-- did exactly that: every complete, renew or fail read all running jobs instead of one
-- primary-key entry.
CREATE INDEX jobs_lease_idx ON pgq.jobs (lease_until)
    WHERE lease_until IS NOT NULL;

-- Deduplication: one live job per (queue, unique_key), race-free. outcome_unknown counts as live:
-- its effect may have happened, which is exactly when a duplicate would hurt; so does waiting
-- (enqueued with depends_on, it will run).
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgq.jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('waiting', 'pending', 'running', 'outcome_unknown');

-- The sweep's probe and the firing read the enabled schedules by next_run_at; queues.next_schedule_at
-- is kept from the earliest one per queue.
CREATE INDEX schedules_due_idx ON pgq.schedules (next_run_at) WHERE enabled;
CREATE INDEX schedules_queue_idx ON pgq.schedules (queue, next_run_at) WHERE enabled;

-- A claim that names its kinds walks each (queue, kind)'s claimable jobs in the total order: jobs
-- of other kinds ahead of them are never read. Only pending jobs are in it (an enqueue, a retry
-- or a snooze writes an entry; a claim and a completion do not).
CREATE INDEX jobs_kind_ready_idx ON pgq.jobs (queue, kind, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts;

-- pgq.list_jobs pages newest first by id within each queue and state. Running jobs are not in it
-- (a claim writes no entry here; list_jobs reads the few running jobs through jobs_lease_idx).
-- The key is -id, not id: ordered by -id, a page can only come from this index, where ordered by
-- id the generic plan could walk jobs_pkey backwards and filter, reading every newer job of other
-- queues and states (all the finished history) to find a page of a rare one.
CREATE INDEX jobs_list_idx ON pgq.jobs (queue, state, (-id))
    WHERE state <> 'running';

-- pgq.list_jobs finds the queues with grants (few, if any) without reading the others.
CREATE INDEX queues_restricted_idx ON pgq.queues (name) WHERE restricted IS NOT NULL;

-- Pruning finds finished rows by age.
CREATE INDEX jobs_finished_idx ON pgq.jobs (finished_at)
    WHERE state IN ('done', 'failed', 'cancelled');

-- The keys without a token now (tat furthest ahead), read by each claim of a key-rate-limited queue.
CREATE INDEX key_rates_tat_idx ON pgq.key_rates (queue, tat);
-- A waiting job that ends (pgq.cancel, or cancelled with its dependency) deletes its own links.
CREATE INDEX job_dependencies_job_idx ON pgq.job_dependencies (job_id);

-- Functions: internal helpers ---------------------------------------------------------------------

-- The database's notion of "now" for leases and run_at. Every pgq function reads time through this
-- one inlinable function, so a test database can move time (only the schema owner can replace it).
CREATE FUNCTION pgq._now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT statement_timestamp() $$;
COMMENT ON FUNCTION pgq._now() IS
    'The clock of every lease and run_at decision: the start of the current statement, so that a '
    'claim inside a long transaction still gets its whole lease.';

-- Raises invalid_parameter_value (or null_value_not_allowed) naming the argument.
CREATE FUNCTION pgq._bad_argument(argument text, problem text, hint text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    code text := CASE WHEN problem = 'must not be NULL' THEN '22004' ELSE '22023' END;
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION 'pgq: argument "%" %', argument, problem USING ERRCODE = code;
    END IF;
    RAISE EXCEPTION 'pgq: argument "%" %', argument, problem USING ERRCODE = code, HINT = hint;
END
$$;
COMMENT ON FUNCTION pgq._bad_argument(text, text, text) IS
    'Raises 22023 (or 22004 for NULL) with a message naming the argument.';

-- What a queue or kind name is: 1 to 128 characters from [A-Za-z0-9_.:/-], not starting with a
-- punctuation mark other than "_". NULL for NULL. A one-expression SQL function, so the planner
-- inlines it where it is used (no call on the hot path). The length is checked apart from the
-- pattern: a bounded repetition ({0,127}) made every match about 13 us instead of 1 us.
CREATE FUNCTION pgq._is_name(text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT length($1) <= 128 AND $1 ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$' $$;

-- Validates a queue or kind name (pgq._is_name), naming the argument when it is not one.
CREATE FUNCTION pgq._check_name(argument text, value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL');
    ELSIF NOT pgq._is_name(value) THEN
        PERFORM pgq._bad_argument(argument,
            format('is not a valid name: %s', left(quote_literal(value), 80)),
            'Names are 1 to 128 characters from A-Z a-z 0-9 _ . : / - and start with a letter, '
            'a digit or _.');
    END IF;
END
$$;

-- Validates an interval argument: a span (pgq._is_span), > 0 and at most max_value.
CREATE FUNCTION pgq._check_interval(argument text, value interval, max_value interval)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL');
    END IF;
    PERFORM pgq._check_span(argument, value);
    IF value <= interval '0' OR value > max_value THEN
        PERFORM pgq._bad_argument(argument,
            format('must be greater than 0 and at most %s, got %s', max_value, value));
    END IF;
END
$$;

-- Refuses an interval that is not a span (pgq._is_span), naming the argument: 22023.
CREATE FUNCTION pgq._check_span(argument text, value interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF extract(year FROM value) <> 0 OR extract(month FROM value) <> 0 THEN
        PERFORM pgq._bad_argument(argument, format('must not count months or years, got %s', value),
            'Months differ in length: give days (''30 days''), hours, minutes or seconds.');
    ELSIF NOT pgq._is_span(value) THEN
        PERFORM pgq._bad_argument(argument,
            format('must not mix a positive and a negative part, got %s', value),
            'Give one span, such as ''23:00:01'' instead of ''1 day -00:59:59''.');
    END IF;
END
$$;

-- The real size of a jsonb value in bytes: pg_column_size measures a compressed datum (a value
-- read from a table column, say) as stored, so 50 MB of repeat('x', ...) measured 0.6 MB. Only a
-- compressed value is decompressed to be measured (jsonb || '{}' returns the detoasted object);
-- any other is measured as it is, at no extra cost. One expression: inlined where it is used
-- (STABLE like pg_column_size: an IMMUTABLE wrapper of a STABLE function is not inlined, and its
-- call cost an enqueue 20 to 50 us).
CREATE FUNCTION pgq._jsonb_size(jsonb) RETURNS integer
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN pg_column_compression($1) IS NULL THEN pg_column_size($1)
                ELSE pg_column_size($1 || '{}'::jsonb) END
$$;

-- Validates a payload: a JSON object of at most 1 MiB (its jsonb size, uncompressed).
CREATE FUNCTION pgq._check_payload(argument text, value jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL', 'Pass ''{}'' for an empty payload.');
    ELSIF jsonb_typeof(value) <> 'object' THEN
        PERFORM pgq._bad_argument(argument,
            format('must be a JSON object, got %s', jsonb_typeof(value)),
            'Wrap the value: jsonb_build_object(''value'', ...).');
    ELSIF pgq._jsonb_size(value) > 1048576 THEN
        PERFORM pgq._bad_argument(argument,
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(value)),
            'Store large data in a table of your own and put its key in the payload.');
    END IF;
END
$$;

-- Validates the (id, attempt) pair an owner operation quotes. A NULL is a bug in the caller, not
-- lost ownership: it raises 22004 instead of answering "not yours" (a NULL attempt would otherwise
-- reach pgq._reject and fail on job_events.attempt NOT NULL with an unrelated 23502).
CREATE FUNCTION pgq._check_fence(id bigint, attempt integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_fence.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    ELSIF _check_fence.attempt IS NULL THEN
        PERFORM pgq._bad_argument('attempt', 'must not be NULL', 'Quote the attempt pgq.claim returned.');
    END IF;
END
$$;

-- Validates the optional enqueue arguments shared by enqueue and enqueue_many.
CREATE FUNCTION pgq._check_enqueue(queue text, kind text, run_at timestamptz, priority integer,
                                   max_attempts integer, tenant text)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._check_name('queue', _check_enqueue.queue);
    PERFORM pgq._check_name('kind', _check_enqueue.kind);
    IF _check_enqueue.run_at IS NULL THEN
        PERFORM pgq._bad_argument('run_at', 'must not be NULL', 'Omit it to run now.');
    ELSIF NOT isfinite(_check_enqueue.run_at) THEN
        PERFORM pgq._bad_argument('run_at', format('must be a finite time, got %s', _check_enqueue.run_at));
    END IF;
    IF _check_enqueue.priority IS NULL THEN
        PERFORM pgq._bad_argument('priority', 'must not be NULL', 'Omit it for priority 0.');
    ELSIF _check_enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM pgq._bad_argument('priority',
            format('must be between -1000 and 1000, got %s', _check_enqueue.priority));
    END IF;
    IF _check_enqueue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', _check_enqueue.max_attempts));
    END IF;
    IF length(_check_enqueue.tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('tenant', 'must be 1 to 256 characters long');
    END IF;
END
$$;

-- Validates a unique_key: 1 to 1024 bytes. Bytes, not characters: the key is in an index entry
-- with the queue's name (at most 128 bytes), and a B-tree entry holds at most 2704 bytes, so 1,024
-- four-byte characters (4,096 bytes) failed the insert with 54000 instead of a clear refusal.
CREATE FUNCTION pgq._check_unique_key(unique_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF octet_length(unique_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM pgq._bad_argument('unique_key',
            format('must be 1 to 1024 bytes long (UTF-8), got %s bytes', octet_length(unique_key)),
            'Hash a longer key, e.g. md5(key).');
    END IF;
END
$$;

-- Validates a concurrency key (a job's, or pgq.set_key_limit's): NULL or 1 to 256 characters.
-- Rate limits (queues.rate_limit, key_rate_limit) are GCRA buckets of `rate` tokens per
-- `period`: a burst of at most `rate`, then `rate` per `period`. The state is one timestamp, the
-- theoretical arrival time (tat): when the bucket is full again (NULL or past: full now). Taking
-- n tokens at `at` moves it to greatest(tat, at) + n * period / rate, and is allowed while that
-- is at most at + period. So in any window of length W the claims take at most
-- rate + floor(W * rate / period) tokens (the tat advances by period / rate per token and never
-- passes the latest clock reading plus period). The arithmetic is exact (numeric epochs, tat
-- rounded up to the microsecond).

-- The clock of the rate limits: clock_timestamp(), read by pgq.claim once it holds the queue rows
-- it limits. Not pgq._now() (statement_timestamp) or now(): a claim whose statement or
-- transaction started before another claim's took the lock would spend tokens at an earlier
-- moment than they are handed out, and so refill the bucket for the claims after it; read after
-- the lock, the readings of one queue's claims come in the order they hand out their jobs. (A
-- test database may replace this function, like pgq._now().)
CREATE FUNCTION pgq._rate_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
COMMENT ON FUNCTION pgq._rate_clock() IS
    'The clock of the rate limits: clock_timestamp(), read once the claim holds its queue rows.';

-- How many tokens a bucket (its tat, rate and period) holds at `at`.
CREATE FUNCTION pgq._tokens(tat timestamptz, rate integer, period interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 IS NULL OR $1 <= $4 THEN $2
                ELSE greatest(floor(extract(epoch FROM $3 - ($1 - $4)) * $2 / extract(epoch FROM $3)), 0)::integer
           END
$$;

-- When a bucket holds a token again; NULL when it holds one at `at` (or has no rate).
CREATE FUNCTION pgq._next_token_at(tat timestamptz, rate integer, period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $2 > 0 AND pgq._tokens($1, $2, $3, $4) < 1
                THEN $1 - $3 + ceil(extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
           END
$$;

-- A bucket's tat once n tokens are taken at `at` (rounded up to the microsecond: never early).
CREATE FUNCTION pgq._tat_after(tat timestamptz, rate integer, period interval, at timestamptz, n integer)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT greatest($1, $4) + ceil($5 * extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
$$;

-- A bucket's tat when its rate or period changes (pgq.configure_queue): what it handed out still
-- counts, as the same number of tokens of the new rate (at most a whole bucket: empty).
CREATE FUNCTION pgq._rescaled_tat(tat timestamptz, old_rate integer, old_period interval, rate integer,
                                  period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 > $6 AND $2 > 0 AND $4 > 0
                THEN $6 + least(($1 - $6) * (extract(epoch FROM $5) * $2 / (extract(epoch FROM $3) * $4))::float8, $5)
           END
$$;

-- Deletes up to max_rows rows of pgq.key_rates whose bucket is full again (pgq.sweep,
-- pgq.prune), queue by queue under the queue's row lock, like the claims that write them (a queue
-- whose row another session holds is skipped): at the clock read after the lock, such a row
-- says what no row says, so no claim after it can tell.
CREATE FUNCTION pgq._prune_key_rates(max_rows integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    deleted integer := 0;
    r record;
BEGIN
    FOR r IN SELECT DISTINCT k.queue FROM pgq.key_rates AS k WHERE k.tat <= pgq._rate_clock() LOOP
        EXIT WHEN deleted >= _prune_key_rates.max_rows;
        PERFORM FROM pgq.queues AS q WHERE q.name = r.queue FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        WITH gone AS (
            DELETE FROM pgq.key_rates AS k
            WHERE k.queue = r.queue AND k.key IN (
                SELECT x.key FROM pgq.key_rates AS x
                WHERE x.queue = r.queue AND x.tat <= pgq._rate_clock()
                LIMIT _prune_key_rates.max_rows - deleted)
            RETURNING 1
        )
        SELECT deleted + count(*) INTO deleted FROM gone;
    END LOOP;
    RETURN deleted;
END
$$;

CREATE FUNCTION pgq._check_concurrency_key(argument text, value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF length(_check_concurrency_key.value) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument(_check_concurrency_key.argument, 'must be 1 to 256 characters long');
    END IF;
END
$$;

-- The queue's settings row, created with the defaults on first use.
CREATE FUNCTION pgq._queue(name text) RETURNS pgq.queues
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

-- The settings row of a queue that must exist: 22023 naming the argument and the queue otherwise
-- (a typo must not create a queue, nor act on nothing).
CREATE FUNCTION pgq._existing_queue(argument text, name text) RETURNS pgq.queues
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

-- The tenant a job of a fair queue is stored under ('' for none), registered in pgq.tenants.
CREATE FUNCTION pgq._fair_tenant(queue text, tenant text) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    stored text := coalesce(_fair_tenant.tenant, '');
BEGIN
    INSERT INTO pgq.tenants AS t (queue, tenant) VALUES (_fair_tenant.queue, stored)
    ON CONFLICT DO NOTHING;
    RETURN stored;
END
$$;

-- Wakes listening workers (LISTEN pgq) for a queue that has a job due now, if the queue notifies.
-- PostgreSQL folds identical notifications of one transaction into one.
CREATE FUNCTION pgq._notify(queue text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = _notify.queue) THEN
        PERFORM pg_notify('pgq', _notify.queue);
    END IF;
END
$$;

-- Retry delay after a failed attempt: exponential from base, capped, with jitter in the upper
-- half. Always within [base, cap], for any attempt. The growth is computed in float8 seconds with
-- a clamped exponent: multiplying the interval itself overflows ("interval out of range") as soon
-- as base * 2^(attempt-1) passes the interval range, e.g. base 1 hour at attempt 41 or base
-- 365 days at attempt 25, which would make pgq.fail raise instead of scheduling the retry.
CREATE FUNCTION pgq._backoff(attempt integer, base interval, cap interval) RETURNS interval
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
    SELECT least(_backoff.cap,
                 greatest(_backoff.base, make_interval(secs => d.ceiling_secs * (0.5 + random() * 0.5))))
    FROM (SELECT least(extract(epoch FROM _backoff.cap)::float8,
                       extract(epoch FROM _backoff.base)::float8
                       * power(2::float8, least(greatest(_backoff.attempt, 1) - 1, 62)))
                 AS ceiling_secs) AS d
$$;
COMMENT ON FUNCTION pgq._backoff(integer, interval, interval) IS
    'min(cap, base * 2^(attempt-1)) scaled by a random factor in [0.5, 1], never below base.';

-- Records a rejected write by an owner that no longer owns the job (a stale attempt), so that a
-- duplicate execution can be diagnosed from pgq.job_events. Writes nothing for unknown ids or
-- for queues with audit off. A repeated rejection (the same job, attempt and operation, the note
-- starting with the operation's name, while the job is in the same state) is recorded once:
-- `times` more on the event that recorded it first, so 10,000 bogus calls write one event, not
-- 10,000 (a rejection after the job moved on, say from running to done, is an event of its own).
-- Rejections of one (job, attempt) take turns (a transaction-level advisory lock on the pair, one
-- bigint key), so two concurrent ones cannot both find no event and both write one.
CREATE FUNCTION pgq._reject(job_id bigint, attempt integer, operation text, times integer DEFAULT 1)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    SELECT j.* INTO job FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE j.id = _reject.job_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock((_reject.job_id << 31) # _reject.attempt);
    -- The key of "the same rejection": job, attempt, operation, the job's state and the login
    -- that made the call (one more condition per column that should tell rejections apart).
    UPDATE pgq.job_events AS e
    SET times = e.times + _reject.times
    WHERE e.job_id = _reject.job_id AND e.attempt = _reject.attempt AND e.event = 'rejected'
      AND starts_with(e.note, _reject.operation || ' from attempt ') AND e.from_state = job.state
      AND e.session_role IS NOT DISTINCT FROM session_user;
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note, times)
    VALUES (job.id, _reject.attempt, NULL, 'rejected', job.state, NULL,
            format('%s from attempt %s rejected: the job is %s at attempt %s (last claimed by %s%s)',
                   _reject.operation, _reject.attempt, job.state, job.attempt, job.claimed_by,
                   CASE WHEN NOT pgq._same_login(job.session_role) THEN ', login ' || job.session_role END),
            _reject.times);
END
$$;

-- How far a job's max_attempts may pass its attempts so far: a job can be released or snoozed
-- (each gives one attempt back) until max_attempts - attempt_offset reaches this, never past it,
-- so no counter can overflow: with 1,000,000 here and the failover fence's 100,000 attempt numbers
-- per timeline change (pgq._fence_step), a job's counters stay below 2^31 - 1 through
-- (2147483647 - 1000000) / 100000 = 21,464 timeline changes.
CREATE FUNCTION pgq._attempt_room() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 1000000 $$;

-- Raises 54000 for a job that would pass its attempt room (pgq._attempt_room) by one more attempt.
CREATE FUNCTION pgq._no_attempt_room(id bigint, operation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgq: % of job % refused: the job has been given % attempts (releases and snoozes '
        'count), its limit', operation, id, pgq._attempt_room()
        USING ERRCODE = 'program_limit_exceeded',
              HINT = 'Fail or cancel the job: it cannot be given an attempt back again.';
END
$$;

-- The queue row for an admin call, locked (FOR NO KEY UPDATE, or FOR UPDATE to delete it), or
-- NULL when there is none. Admin calls wait for another session's lock on a queue row at most
-- lock_timeout (5 s: this function's and theirs): an idle transaction that claimed from a capped
-- queue holds its row until it ends. Then 55P03, naming the sessions that hold it.
CREATE FUNCTION pgq._lock_queue(name text, for_delete boolean DEFAULT false) RETURNS pgq.queues
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
                  HINT = 'A transaction that claimed from it (or changes it) has not ended: see '
                         'pgq.health() (idle_in_transaction) or pg_stat_activity, end it, and try again.';
    END;
    RETURN q;
END
$$;

-- The queue's writer lock: a transaction-level advisory lock on the two int4 keys (1885827329,
-- hashtext(queue)) (the first is 'pgq' and a byte). Every job insert (enqueue, enqueue_many, a
-- schedule's firing) holds it shared until its transaction ends; pgq.drop_queue and pgq.prune take it
-- exclusively before they remove a queue's row or its idle tenants, so that they see every job
-- written into the queue (a job inserted meanwhile would be left without a queue, or a tenant).

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
CREATE FUNCTION pgq._recover_expired(max_jobs integer)
    RETURNS TABLE (queue text, recovered bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT j.id, j.attempt
        FROM pgq.jobs AS j
        WHERE j.state = 'running' AND j.lease_until < pgq._now()
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
END
$$;

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
CREATE FUNCTION pgq._owns(owner text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT $1 = session_user::text OR $1 IS NULL OR pg_has_role(session_user, 'pgq_admin', 'MEMBER') $$;

-- Whether the session's login made the latest owner operation of a job whose session_role is
-- `actor` (NULL: before migration 0008): only then is a repeated call answered as the first one.
CREATE FUNCTION pgq._same_login(actor text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT $1 = session_user::text OR $1 IS NULL $$;

-- Whether the session's login may use `privilege` on `queue`, whose queues.restricted is
-- `restricted`: always when that privilege has no grant on the queue; otherwise for members of a
-- role granted it (read: granted read or claim, since a worker reads the jobs it may claim) and
-- of pgq_admin.
CREATE FUNCTION pgq._may(queue text, restricted text[], privilege text) RETURNS boolean
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
CREATE FUNCTION pgq._may_read(queue text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((SELECT pgq._may(q.name, q.restricted, 'read') FROM pgq.queues AS q
                     WHERE q.name = _may_read.queue), true)
$$;

-- Raises 42501: the queue's grants of `privilege` do not admit the session's login.
CREATE FUNCTION pgq._denied(queue text, privilege text) RETURNS void
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
CREATE FUNCTION pgq._may_claim(queue text, restricted text[], named boolean) RETURNS boolean
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
CREATE FUNCTION pgq._may_see_query(usesysid oid) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(pg_has_role(session_user, _may_see_query.usesysid, 'USAGE'), false)
        OR pg_has_role(session_user, 'pg_read_all_stats', 'USAGE')
$$;

-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); no SET clause, so that the hot path pays no configuration switch per row: every name
-- is schema-qualified.
CREATE FUNCTION pgq._count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pgq.finished_deltas (queue, state) VALUES (NEW.queue, NEW.state);
    -- A job that has dependants, or waits itself, moves its dependants on (pgq._dependency_ended).
    -- Here rather than in a trigger of its own: a second trigger's WHEN, evaluated by every claim
    -- and completion, cost a plain queue's complete about 8 us of about 60 (migration 0013's A/B).
    IF OLD.has_dependants OR OLD.state = 'waiting' THEN
        PERFORM pgq._dependency_ended(NEW.id, OLD.state, NEW.state, OLD.has_dependants);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._count_finished() IS
    'Trigger of pgq.jobs: records one transition into done, failed or cancelled in pgq.finished_deltas, '
    'and moves the dependants of a job that has them on (pgq._dependency_ended).';

CREATE TRIGGER jobs_count_finished
    AFTER UPDATE OF state ON pgq.jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION pgq._count_finished();

-- When a job ends, its dependants move on, in the same transaction (every path into done, failed
-- or cancelled is an UPDATE of state: complete, complete_many, fail, resolve, cancel, the recovery
-- of expired leases). Done: each waiting dependant counts one dependency fewer, and the one that
-- reaches 0 becomes pending (its queue's workers are notified when it is due). Failed or
-- cancelled: every waiting job down the chain is cancelled, by one statement (a recursive query
-- over pgq.job_dependencies through waiting jobs: a trigger per level would nest as deep as the
-- chain is long), with last_error naming the dependency. The trigger of each job it cancels calls it
-- too, and finds the rest of the chain cancelled already (so it stops at once) but for a job
-- enqueued to depend on it while the statement waited for that enqueue's lock on it.
-- A waiting job that ends (cancelled) deletes its own links.
-- pgq._count_finished (the trigger jobs_count_finished, which every end fires) calls it only for
-- jobs that have dependants (has_dependants, set by their dependants' enqueue) or are waiting:
-- other completions pay for one IF.
-- A dependant's row is updated by each of its dependencies' completions: they wait for each other
-- on that row, so the count is exact (each decrement reads the newest row version), and the
-- completion that takes it to 0 releases the job. Runs as the owner (like pgq._count_finished:
-- no SET clause, every name schema-qualified).
CREATE FUNCTION pgq._dependency_ended(ended_id bigint, old_state pgq.job_state, new_state pgq.job_state,
                                       had_dependants boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    due_queues text[];
BEGIN
    IF old_state = 'waiting' THEN
        DELETE FROM pgq.job_dependencies AS d WHERE d.job_id = ended_id;
    END IF;
    IF NOT had_dependants THEN
        RETURN;
    END IF;
    IF new_state = 'done' THEN
        WITH released AS (
            UPDATE pgq.jobs AS j
            SET dependencies_left = j.dependencies_left - 1,
                state = CASE WHEN j.dependencies_left = 1 THEN 'pending' ELSE 'waiting' END::pgq.job_state,
                last_event = CASE WHEN j.dependencies_left = 1 THEN 'dependencies_done' ELSE j.last_event END
            FROM pgq.job_dependencies AS d
            WHERE d.depends_on = ended_id AND j.id = d.job_id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.attempt, j.state, j.run_at
        ), events AS (
            INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
            SELECT r.id, r.attempt, NULL, 'dependencies_done', 'waiting', 'pending',
                   format('the last of its dependencies, job %s, is done', ended_id)
            FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
            WHERE r.state = 'pending'
        )
        SELECT array_agg(DISTINCT r.queue) INTO due_queues
        FROM released AS r WHERE r.state = 'pending' AND r.run_at <= pgq._now();
        PERFORM pgq._notify(n.queue) FROM unnest(due_queues) AS n(queue);
    ELSE
        WITH RECURSIVE chain (id, dependency) AS (
            SELECT d.job_id, d.depends_on
            FROM pgq.job_dependencies AS d JOIN pgq.jobs AS w ON w.id = d.job_id AND w.state = 'waiting'
            WHERE d.depends_on = ended_id
            UNION
            SELECT d.job_id, d.depends_on
            FROM chain AS c JOIN pgq.job_dependencies AS d ON d.depends_on = c.id
            JOIN pgq.jobs AS w ON w.id = d.job_id AND w.state = 'waiting'
        ), cancelled AS (
            UPDATE pgq.jobs AS j
            SET state = 'cancelled', finished_at = pgq._now(), last_event = 'dependency_ended',
                last_error = CASE WHEN c.dependency = ended_id
                                  THEN format('pgq: cancelled: its dependency, job %s, ended %s', ended_id, new_state)
                                  ELSE format('pgq: cancelled: its dependency, job %s, was cancelled because job %s, '
                                              'up its chain, ended %s', c.dependency, ended_id, new_state) END
            FROM (SELECT DISTINCT ON (c.id) c.id, c.dependency FROM chain AS c
                  ORDER BY c.id, c.dependency <> ended_id, c.dependency) AS c
            WHERE j.id = c.id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.attempt, j.last_error
        )
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT c.id, c.attempt, NULL, 'dependency_ended', 'waiting', 'cancelled', c.last_error
        FROM cancelled AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit;
    END IF;
    DELETE FROM pgq.job_dependencies AS d WHERE d.depends_on = ended_id;
END
$$;
COMMENT ON FUNCTION pgq._dependency_ended(bigint, pgq.job_state, pgq.job_state, boolean) IS
    'Called by pgq._count_finished when a job that has dependants, or waits, ends: releases (done) '
    'or cancels (failed, cancelled) its waiting dependants; a waiting job that ends deletes its links.';



-- Moves the deltas into the totals, in one transaction (so a reader sees each finished job once,
-- in one table or the other). One fold at a time: a fold that finds another one running skips
-- (it would wait for the other's deleted rows, and two folds' upserts could deadlock); in a
-- read-only transaction (a standby, a read-only login) it skips too. Returns the deltas folded.
CREATE FUNCTION pgq._fold_finished() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    folded bigint;
BEGIN
    IF current_setting('transaction_read_only')::boolean
       OR NOT pg_try_advisory_xact_lock('pgq.finished_counts'::regclass::oid::integer, 0) THEN
        RETURN 0;
    END IF;
    -- All of them, by one sequential scan. (A fold bounded by ctid = ANY (ARRAY(SELECT ctid ...
    -- LIMIT n)) ran its cached plan, made while the table was empty, as a filter of a sequential
    -- scan: n x n comparisons, half a second for 10,000 rows. Sweeps and scrapes fold every few
    -- seconds, so the backlog is what finished since the last one.)
    WITH gone AS (
        DELETE FROM pgq.finished_deltas RETURNING queue, state
    ), sums AS (
        SELECT g.queue, g.state, count(*) AS n FROM gone AS g GROUP BY g.queue, g.state
    ), added AS (
        INSERT INTO pgq.finished_counts AS c (queue, state, total)
        SELECT s.queue, s.state, s.n FROM sums AS s ORDER BY s.queue, s.state
        ON CONFLICT (queue, state) DO UPDATE SET total = c.total + excluded.total
    )
    SELECT coalesce(sum(s.n), 0) INTO folded FROM sums AS s;
    RETURN folded;
END
$$;
COMMENT ON FUNCTION pgq._fold_finished() IS
    'Folds pgq.finished_deltas into pgq.finished_counts; skips (returns 0) while another fold runs '
    'or in a read-only transaction.';

-- Functions: cron expressions ---------------------------------------------------------------------
--
-- pgq.cron_next: the next firing of a cron expression, computed in SQL (issue 15, "Schedules").
--
-- pgq.cron_next(cron, after, timezone) is the first instant strictly after `after` whose local
-- wall-clock time in `timezone` matches `cron`. It is called on every firing of a schedule, so it
-- never walks minute by minute: each field is parsed once per call into a bit mask (bit v set when
-- v is allowed), and the search jumps field by field in local time (the next allowed month, then
-- day, then hour, then minute, carrying over into the field above when one runs out), then turns
-- the local time into an instant. A few dozen plain expressions per call, whatever the expression.
--
-- Grammar (the issue's): 5 fields separated by white space,
--   minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC,
--   day-of-week 0-7 or SUN-SAT (0 and 7 are both Sunday); names are case-insensitive.
-- Each field is `*`, a number, `a-b`, `*/n`, `a-b/n`, `a/n` or a comma list of those; or the whole
-- expression is a macro: @yearly = @annually (0 0 1 1 *), @monthly (0 0 1 * *), @weekly
-- (0 0 * * 0), @daily = @midnight (0 0 * * *), @hourly (0 * * * *).
-- Decisions where the issue is silent (as croniter, the tests' reference, has them unless said):
--   * `a/n` runs from a to the field's last value; for day-of-week the last value is 6
--     (Saturday): 7 is only a second name for Sunday, so `1/3` is MON,THU and `*/2` is SUN,TUE,
--     THU,SAT. In a range, SUN as the END means 7, so MON-SUN is the whole week (SUN-SUN is
--     Sunday).
--   * A step larger than its range is allowed and selects the range's first value (`*/90` in the
--     minute field is minute 0). A step of 0 is an error.
--   * A range does not wrap around: `22-2` is an error (reversed range, the issue's rule; croniter
--     wraps it). A one-value range `5-5` is 5 (croniter reads it as `*`).
--   * Day fields: when both are restricted (anything but a bare `*`; `*/2` is restricted) a day
--     matches if EITHER matches; otherwise a day must match both (a bare `*` matches every day).
--     So a list holding `*` (`*,1`) or a range covering every day (`1-31`, `0-7`) is restricted
--     and, matching every day, makes every day match (croniter reads `*,1` and `0-7` as `*`).
--   * An expression that can never match (`0 0 31 2 *`, `0 0 30 2 *`, `0 0 31 4,6,9,11 *`: a
--     day-of-month no allowed month has, with day-of-week `*`) raises 22023 at once, the way
--     croniter refuses it, instead of searching some bounded horizon and answering NULL: a
--     schedule that can never fire is a mistake its author wants to hear about when creating it.
--     Feb 29 alone is a valid schedule: the search jumps to the next leap year (at most 8 years).
--   * `timezone` is any zone PostgreSQL's AT TIME ZONE accepts (IANA names such as
--     'Europe/Berlin', see pg_timezone_names; also abbreviations and POSIX specs, with
--     PostgreSQL's meaning). Unknown: 22023 naming `timezone`.
--   * `after` must be finite (22023); NULL arguments raise 22004 naming them. (A next firing
--     past the end of the timestamp range, year 294276, fails as PostgreSQL does: 22008.)
-- Daylight saving (the issue's rule, which is not croniter's): a local time that does not exist
-- (skipped by a spring-forward transition) does not fire at all; a local time that happens twice
-- (fall-back) fires once, at its first occurrence. So `0 * * * *` in Europe/Berlin fires at 01:00
-- CET and then at 03:00 CEST on the spring day, and at 02:00 CEST then 03:00 CET on the autumn
-- day (the second 02:00, CET, is not a new firing).
--
-- Errors are pgq's (pgq._bad_argument): 22023 with a message naming `cron` and the bad field
-- (`minute`, `hour`, `day-of-month`, `month`, `day-of-week`), or `timezone`, or `after`.
-- The helpers pgq._cron_* are internal: no pgq role may call them (they run as the owner, inside
-- pgq.cron_next, which pins the search_path for them).

-- The smallest v >= x whose bit is set in mask, or NULL when there is none. One expression, so the
-- planner inlines it into the PL/pgSQL that calls it: the lowest set bit of mask >> x is isolated
-- (y & -y) and its position read off its logarithm, exact for powers of two below 2^63.
CREATE FUNCTION pgq._cron_next_bit(mask bigint, x integer) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN x BETWEEN 0 AND 62 AND (mask >> x) <> 0
                THEN x + round(ln(((mask >> x) & -(mask >> x))::float8) / ln(2::float8))::integer
           END
$$;

-- Raises 22023 naming `cron` and one of its fields.
CREATE FUNCTION pgq._cron_bad_field(field text, spec text, problem text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._bad_argument('cron',
        format('has a bad %s field %s: %s', field, left(quote_literal(spec), 80), problem),
        'Five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or JAN-DEC) '
        'day-of-week (0-7 or SUN-SAT, 0 and 7 are Sunday); each *, a number, a-b, */n, a-b/n, a/n '
        'or a comma list of those, e.g. ''*/15 9-17 * * MON-FRI''. Or a macro such as @daily.');
END
$$;

-- One value of a cron field: a number within lo..hi, or a name (names[1] is the value lo).
-- In day-of-week, SUN ending a range is 7, so that MON-SUN is the whole week.
CREATE FUNCTION pgq._cron_value(field text, spec text, token text, lo integer, hi integer,
                                names text[], range_end boolean)
    RETURNS integer
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    v integer;
BEGIN
    IF token <> '' AND translate(token, '0123456789', '') = '' THEN
        IF length(token) > 4 OR token::integer NOT BETWEEN lo AND hi THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('%s is out of range %s-%s', left(token, 20), lo, hi));
        END IF;
        RETURN token::integer;
    END IF;
    v := array_position(names, upper(token));
    IF v IS NULL THEN
        PERFORM pgq._cron_bad_field(field, spec,
            CASE WHEN names IS NULL THEN format('%s is not a number', left(quote_literal(token), 20))
                 ELSE format('%s is not a number or a name (%s)', left(quote_literal(token), 20),
                             array_to_string(names, ' '))
            END);
    END IF;
    v := v - 1 + lo;
    IF range_end AND field = 'day-of-week' AND v = 0 THEN
        v := 7;
    END IF;
    RETURN v;
END
$$;

-- The values one field allows, as a bit mask. lo..hi are the values it may name; `*` and the
-- open end of `a/n` stop at 6 in day-of-week (7 names Sunday again); 7 is folded into 0.
CREATE FUNCTION pgq._cron_field(field text, spec text, lo integer, hi integer, names text[])
    RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    last  integer := CASE WHEN field = 'day-of-week' THEN 6 ELSE hi END;
    mask  bigint := 0;
    item  text;
    body  text;
    steps text;
    a     integer;
    b     integer;
    step  integer;
BEGIN
    IF spec = '*' THEN
        RETURN ((1::bigint << (last + 1)) - 1) & ~((1::bigint << lo) - 1);
    ELSIF translate(spec, '0123456789', '') = '' AND length(spec) BETWEEN 1 AND 2
          AND spec::integer BETWEEN lo AND hi THEN           -- one number: the common case
        RETURN CASE WHEN field = 'day-of-week' AND spec::integer = 7 THEN 1
                    ELSE 1::bigint << spec::integer END;
    END IF;
    FOREACH item IN ARRAY string_to_array(spec, ',') LOOP
        -- item is body[/step], body is *, a or a-b (plain string functions: a regular expression
        -- with captures costs ~40 us here, more than all the rest of a call).
        body := split_part(item, '/', 1);
        steps := CASE WHEN strpos(item, '/') > 0 THEN split_part(item, '/', 2) END;
        IF body = '' OR item LIKE '%/%/%' OR body LIKE '%-%-%' OR steps = ''
           OR translate(steps, '0123456789', '') <> '' OR (body LIKE '*_%') THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('%s is not *, a number, a-b, */n, a-b/n or a/n', left(quote_literal(item), 40)));
        END IF;
        IF body = '*' THEN
            a := lo;
            b := last;
        ELSE
            a := pgq._cron_value(field, spec, split_part(body, '-', 1), lo, hi, names, false);
            b := CASE WHEN strpos(body, '-') > 0
                      THEN pgq._cron_value(field, spec, split_part(body, '-', 2), lo, hi, names, true)
                      WHEN steps IS NOT NULL THEN greatest(a, last)
                      ELSE a
                 END;
            IF b = 7 AND a = 0 AND upper(split_part(body, '-', 2)) = 'SUN' THEN
                b := 0;                                 -- SUN-SUN is Sunday, not the week
            END IF;
        END IF;
        step := CASE WHEN steps IS NULL THEN 1
                     WHEN length(steps) > 4 THEN 9999  -- larger than any range: the first value only
                     ELSE steps::integer
                END;
        IF step = 0 THEN
            PERFORM pgq._cron_bad_field(field, spec, format('the step in %s is 0', quote_literal(item)));
        END IF;
        IF a > b THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('the range %s is reversed (a range does not wrap around: write two, as in 22-23,0-2)',
                       quote_literal(item)));
        END IF;
        FOR v IN a..b BY step LOOP
            mask := mask | (1::bigint << v);
        END LOOP;
    END LOOP;
    IF field = 'day-of-week' AND mask & 128 <> 0 THEN
        mask := (mask | 1) & ~128::bigint;
    END IF;
    RETURN mask;
END
$$;

-- A cron expression as the masks of its fields:
-- {minute, hour, day-of-month, month, day-of-week, day-of-month restricted (0/1), day-of-week
-- restricted (0/1)}. Raises 22023 naming `cron` when it is malformed or can never match.
CREATE FUNCTION pgq._cron_parse(cron text) RETURNS bigint[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    expr   text := btrim(cron, E' \t\r\n');
    fields text[];
    f      bigint[];
BEGIN
    IF left(expr, 1) = '@' THEN
        expr := CASE lower(expr)
                    WHEN '@yearly' THEN '0 0 1 1 *'
                    WHEN '@annually' THEN '0 0 1 1 *'
                    WHEN '@monthly' THEN '0 0 1 * *'
                    WHEN '@weekly' THEN '0 0 * * 0'
                    WHEN '@daily' THEN '0 0 * * *'
                    WHEN '@midnight' THEN '0 0 * * *'
                    WHEN '@hourly' THEN '0 * * * *'
                END;
        IF expr IS NULL THEN
            PERFORM pgq._bad_argument('cron',
                format('is not a known macro: %s', left(quote_literal(cron), 80)),
                'The macros are @yearly (or @annually), @monthly, @weekly, @daily (or @midnight) '
                'and @hourly; or write the 5 fields.');
        END IF;
    END IF;
    fields := CASE WHEN expr = '' THEN '{}'
                   WHEN strpos(expr, '  ') = 0 AND translate(expr, E'\t\r\n', '') = expr
                   THEN string_to_array(expr, ' ')  -- the common case, 5x cheaper than the regexp
                   ELSE regexp_split_to_array(expr, '\s+')
              END;
    IF cardinality(fields) <> 5 THEN
        PERFORM pgq._bad_argument('cron',
            format('must have 5 fields (minute hour day-of-month month day-of-week), got %s: %s',
                   cardinality(fields), left(quote_literal(cron), 80)),
            'For example ''*/15 9-17 * * MON-FRI'' or a macro such as @daily. Seconds and years '
            'are not supported.');
    END IF;
    -- (`*` is spelled out here: a call of _cron_field costs a few microseconds.)
    f := ARRAY[CASE WHEN fields[1] = '*' THEN 1152921504606846975  -- bits 0-59
                    ELSE pgq._cron_field('minute', fields[1], 0, 59, NULL) END,
               CASE WHEN fields[2] = '*' THEN 16777215               -- bits 0-23
                    ELSE pgq._cron_field('hour', fields[2], 0, 23, NULL) END,
               CASE WHEN fields[3] = '*' THEN 4294967294             -- bits 1-31
                    ELSE pgq._cron_field('day-of-month', fields[3], 1, 31, NULL) END,
               CASE WHEN fields[4] = '*' THEN 8190                   -- bits 1-12
                    ELSE pgq._cron_field('month', fields[4], 1, 12,
                                         '{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}') END,
               CASE WHEN fields[5] = '*' THEN 127                    -- bits 0-6
                    ELSE pgq._cron_field('day-of-week', fields[5], 0, 7,
                                         '{SUN,MON,TUE,WED,THU,FRI,SAT}') END,
               (fields[3] <> '*')::integer,
               (fields[5] <> '*')::integer];
    -- With day-of-week `*` a day must match day-of-month: some allowed month must have its
    -- smallest day (31-day months are bits 1 3 5 7 8 10 12 = 5546, 30-day ones 4 6 9 11 = 2640).
    IF f[7] = 0 AND pgq._cron_next_bit(f[3], 1) > (CASE WHEN f[4] & 5546 <> 0 THEN 31
                                                        WHEN f[4] & 2640 <> 0 THEN 30
                                                        ELSE 29 END) THEN
        PERFORM pgq._bad_argument('cron',
            format('never matches: no month its month field %s allows has a day its day-of-month '
                   'field %s allows', left(quote_literal(fields[4]), 40), left(quote_literal(fields[3]), 40)),
            'February has 29 days in leap years only, and April, June, September and November 30.');
    END IF;
    RETURN f;
END
$$;

-- The first local time at or after start (a whole minute) that the parsed fields f match.
CREATE FUNCTION pgq._cron_local(f bigint[], start timestamp) RETURNS timestamp
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    y     integer := date_part('year', start);  -- date_part (float8): extract's numeric is slower
    mo    integer := date_part('month', start);
    d     integer := date_part('day', start);
    h     integer := date_part('hour', start);
    mi    integer := date_part('minute', start);
    n     integer;
    first date;
    w     integer;
BEGIN
    -- Every pass moves forward; with the never-matching expressions refused by _cron_parse, the
    -- longest search (Feb 29 from March 2096: 2104) takes a few dozen passes.
    FOR pass IN 1..2000 LOOP
        n := pgq._cron_next_bit(f[4], mo);
        IF n IS NULL THEN                       -- no allowed month left this year
            y := y + 1; mo := 1; d := 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF n > mo THEN
            mo := n; d := 1; h := 0; mi := 0;
        END IF;
        first := make_date(y, mo, 1);
        IF f[6] = 0 AND f[7] = 0 THEN           -- both day fields `*`: every day
            n := d;
        ELSIF f[7] = 0 THEN                     -- day-of-month alone
            n := pgq._cron_next_bit(f[3], d);
        ELSE                                    -- day-of-week (mask doubled to wrap the week),
            w := date_part('dow', first + (d - 1));   -- or-ed with day-of-month if restricted
            n := d + pgq._cron_next_bit(f[5] | (f[5] << 7), w) - w;
            IF f[6] = 1 THEN
                n := least(n, pgq._cron_next_bit(f[3], d));
            END IF;
        END IF;
        IF n IS NULL OR n > ((first + interval '1 month')::date - first) THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;  -- mo 13 finds no month: next year
            CONTINUE;
        ELSIF n > d THEN
            d := n; h := 0; mi := 0;
        END IF;
        n := pgq._cron_next_bit(f[2], h);
        IF n IS NULL THEN
            d := d + 1; h := 0; mi := 0;        -- past the month's end finds no day: next month
            CONTINUE;
        ELSIF n > h THEN
            h := n; mi := 0;
        END IF;
        n := pgq._cron_next_bit(f[1], mi);
        IF n IS NULL THEN
            h := h + 1; mi := 0;                -- hour 24 finds no hour: next day
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, n, 0);
    END LOOP;
    RAISE EXCEPTION 'pgq: cron_next found no match (a bug: please report it)' USING ERRCODE = 'XX000';
END
$$;

-- The first instant whose local time in tz is l, or NULL when l does not exist there (a DST gap).
-- PostgreSQL reads an ambiguous local time as its LATER instant (the offset after a fall-back)
-- and a nonexistent one with the offset before the gap; the earlier instant of an ambiguous time
-- is read with the offset in force a day before. Each candidate counts only if it maps back to l.
CREATE FUNCTION pgq._cron_instant(l timestamp, tz text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT least(CASE WHEN (((l - interval '1 day') AT TIME ZONE tz) + interval '1 day') AT TIME ZONE tz = l
                      THEN ((l - interval '1 day') AT TIME ZONE tz) + interval '1 day' END,
                 CASE WHEN (l AT TIME ZONE tz) AT TIME ZONE tz = l THEN l AT TIME ZONE tz END)
$$;

CREATE FUNCTION pgq.cron_next(cron text, after timestamptz, timezone text DEFAULT 'UTC')
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    f      bigint[];
    l      timestamp;     -- a local candidate
    at     timestamptz;   -- its first occurrence (NULL: it does not exist)
    width  integer;       -- the DST transition's width, in minutes
    lo     integer;
    hi     integer;
    mid    integer;
BEGIN
    IF cron_next.cron IS NULL THEN
        PERFORM pgq._bad_argument('cron', 'must not be NULL');
    ELSIF cron_next.after IS NULL THEN
        PERFORM pgq._bad_argument('after', 'must not be NULL', 'Pass now() for the next firing from now.');
    ELSIF NOT isfinite(cron_next.after) THEN
        PERFORM pgq._bad_argument('after', format('must be a finite timestamp, got %s', cron_next.after));
    ELSIF cron_next.timezone IS NULL THEN
        PERFORM pgq._bad_argument('timezone', 'must not be NULL', 'Omit it for UTC.');
    END IF;
    f := pgq._cron_parse(cron_next.cron);
    BEGIN
        l := cron_next.after AT TIME ZONE cron_next.timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM pgq._bad_argument('timezone',
            format('is not a time zone PostgreSQL knows: %s', left(quote_literal(cron_next.timezone), 80)),
            'Use an IANA name such as ''Europe/Berlin'' or ''America/New_York'' (see '
            'pg_timezone_names), or ''UTC''.');
    END;
    l := date_trunc('minute', l) + interval '1 minute';
    FOR pass IN 1..100 LOOP
        l := pgq._cron_local(f, l);
        at := pgq._cron_instant(l, cron_next.timezone);
        IF at > cron_next.after THEN
            RETURN at;
        END IF;
        -- l does not exist (a spring-forward gap: at IS NULL) or it already happened (its first
        -- occurrence is not after `after`, which lies in the second pass of a fall-back overlap).
        -- Either way the first whole local minute past l that exists and whose first occurrence
        -- is after `after` (where the gap or overlap ends) is at most the transition's width past
        -- l: bisect for it, then search on from there.
        width := ceil(abs(extract(epoch FROM
                     CASE WHEN at IS NULL
                          THEN ((l AT TIME ZONE cron_next.timezone) AT TIME ZONE cron_next.timezone) - l
                          ELSE (l AT TIME ZONE cron_next.timezone) - at
                     END)) / 60);
        lo := 1;
        hi := greatest(width, 1);
        WHILE lo < hi LOOP
            mid := (lo + hi) / 2;
            IF pgq._cron_instant(l + make_interval(mins => mid), cron_next.timezone) > cron_next.after THEN
                hi := mid;
            ELSE
                lo := mid + 1;
            END IF;
        END LOOP;
        l := l + make_interval(mins => hi);
    END LOOP;
    RAISE EXCEPTION 'pgq: cron_next found no match (a bug: please report it)' USING ERRCODE = 'XX000';
END
$$;
COMMENT ON FUNCTION pgq.cron_next(text, timestamptz, text) IS
    'The first instant strictly after `after` whose local time in `timezone` matches the 5-field '
    'cron expression (or macro); a nonexistent local time is skipped, a repeated one fires once.';

-- Functions: schedules' helpers -------------------------------------------------------------------

-- The first fire time of a schedule strictly after `after`: the instants 'epoch' + k * every,
-- computed in microseconds since the epoch (no calendar, no time zone), or pgq.cron_next.
CREATE FUNCTION pgq._next_fire(cron text, every interval, timezone text, after timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    step numeric;
BEGIN
    IF _next_fire.every IS NULL THEN
        RETURN pgq.cron_next(_next_fire.cron, _next_fire.after, _next_fire.timezone);
    END IF;
    step := round(extract(epoch FROM _next_fire.every) * 1000000);
    RETURN 'epoch'::timestamptz
           + ((floor(round(extract(epoch FROM _next_fire.after) * 1000000) / step) + 1) * step)::float8
             * interval '1 microsecond';
END
$$;

-- Sets queues.next_schedule_at of the given queues from their enabled schedules (the earliest
-- next_run_at), writing only rows whose value changes. The queue rows are locked first, in name
-- order; with skip_locked, a row another transaction holds is left as it is instead of waited
-- for: the firing, which holds schedule and job rows meanwhile, never waits here, so it can take
-- part in no deadlock. A value left behind is at worst early: the next claim of that queue finds
-- nothing due and corrects it. Without skip_locked (pgq.schedule, pgq.unschedule) the wait is
-- pgq._lock_queue's: at most its lock_timeout, then 55P03 with a hint.
CREATE FUNCTION pgq._refresh_schedule_due(queues text[], skip_locked boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    locked text[];
BEGIN
    IF skip_locked THEN
        locked := ARRAY(SELECT u.name FROM pgq.queues AS u WHERE u.name = ANY (_refresh_schedule_due.queues)
                        ORDER BY u.name FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        locked := ARRAY(SELECT l.name
                        FROM (SELECT DISTINCT u.name FROM unnest(_refresh_schedule_due.queues) AS u(name)
                              WHERE u.name IS NOT NULL ORDER BY u.name) AS n
                        CROSS JOIN LATERAL pgq._lock_queue(n.name) AS l
                        WHERE l.name IS NOT NULL);
    END IF;
    -- A new statement, so its snapshot sees what the previous holders of these rows committed.
    UPDATE pgq.queues AS q
    SET next_schedule_at = d.at
    FROM (SELECT n.name, (SELECT min(x.next_run_at) FROM pgq.schedules AS x
                          WHERE x.queue = n.name AND x.enabled) AS at
          FROM unnest(locked) AS n(name)) AS d
    WHERE q.name = d.name AND q.next_schedule_at IS DISTINCT FROM d.at;
END
$$;

-- Fires up to max_schedules due schedules (of `queues`, or of every queue when NULL); returns how
-- many jobs it enqueued. Each due schedule
-- is locked (FOR NO KEY UPDATE SKIP LOCKED: a schedule another session is firing is skipped, not
-- waited for, and a row changed after this statement's snapshot is re-checked on its newest
-- version, so a schedule just fired elsewhere is no longer due). Its latest due occurrence (the
-- missed ones before it collapse into it) becomes one job whose run_at is the fire time, in the
-- same transaction that moves next_run_at past now: at most one job per (schedule, fire time).
-- With skip_if_running, an occurrence is skipped (counted in skipped) while the schedule's last
-- job is pending or running. Then the queues' next_schedule_at is brought up to date: of the
-- queues whose schedules it handled, and of those whose value says due (a value computed by a
-- concurrent firing from an older snapshot is corrected here, by the next claim or sweep).
CREATE FUNCTION pgq._fire_schedules(max_schedules integer, queues text[] DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    s          pgq.schedules;
    at_now     timestamptz := pgq._now();
    fire       timestamptz;  -- the latest due occurrence
    hi         timestamptz;  -- no occurrence in (hi, at_now]
    t          timestamptz;
    q          pgq.queues;
    job_tenant text;
    new_id     bigint;
    fired      integer := 0;
    touched    text[] := '{}';
BEGIN
    FOR s IN
        SELECT * FROM pgq.schedules AS x
        WHERE x.enabled AND x.next_run_at <= at_now
          AND (_fire_schedules.queues IS NULL OR x.queue = ANY (_fire_schedules.queues))
        ORDER BY x.next_run_at
        LIMIT _fire_schedules.max_schedules
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        touched := touched || s.queue;
        -- next_run_at is an occurrence, and due: find the latest one at or before now.
        fire := s.next_run_at;
        IF s.every IS NOT NULL THEN
            -- (every is subtracted as seconds: an interval with days would follow the session's
            -- daylight saving time.)
            fire := greatest(fire, pgq._next_fire(NULL, s.every, s.timezone,
                                                  at_now - make_interval(secs => extract(epoch FROM s.every))));
        ELSE
            -- Bisection over (fire, hi]: each step halves the gap or steps to the next
            -- occurrence, so a week of missed minutes costs a few dozen cron_next calls.
            hi := at_now;
            LOOP
                t := pgq.cron_next(s.cron, fire, s.timezone);
                EXIT WHEN t > hi;
                fire := t;
                t := pgq.cron_next(s.cron, to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2),
                                   s.timezone);
                IF t <= hi THEN
                    fire := t;
                ELSE
                    hi := to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2);
                END IF;
            END LOOP;
        END IF;

        IF s.skip_if_running AND EXISTS (SELECT FROM pgq.jobs AS j
                                         WHERE j.id = s.last_job_id AND j.state IN ('pending', 'running')) THEN
            UPDATE pgq.schedules AS x
            SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
                last_skipped_at = fire, skipped = x.skipped + 1
            WHERE x.name = s.name;
            CONTINUE;
        END IF;

        -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
        PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(s.queue));
        q := pgq._queue(s.queue);
        job_tenant := s.tenant;
        IF q.fair THEN
            job_tenant := pgq._fair_tenant(q.name, job_tenant);
        END IF;
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant, schedule)
        VALUES (s.queue, s.kind, s.payload, s.priority, fire, coalesce(s.max_attempts, q.max_attempts),
                job_tenant, s.name)
        RETURNING j.id INTO new_id;
        UPDATE pgq.schedules AS x
        SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
            last_run_at = fire, last_job_id = new_id
        WHERE x.name = s.name;
        IF q.notify THEN
            PERFORM pg_notify('pgq', s.queue);
        END IF;
        fired := fired + 1;
    END LOOP;
    PERFORM pgq._refresh_schedule_due(ARRAY(
        SELECT DISTINCT t.name FROM unnest(touched) AS t(name)
        UNION
        SELECT u.name FROM pgq.queues AS u
        WHERE u.next_schedule_at <= at_now
          AND (_fire_schedules.queues IS NULL OR u.name = ANY (_fire_schedules.queues))), true);
    RETURN fired;
END
$$;

-- The timeline this primary writes WAL on: the first 8 hex digits of its current WAL file's name.
-- It changes the moment a standby is promoted (or a backup is restored to a point in time);
-- pg_control_checkpoint()'s timeline only at the next checkpoint.
CREATE FUNCTION pgq._timeline() RETURNS integer
    LANGUAGE sql VOLATILE
    AS $$ SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer $$;

-- How many attempt numbers a fence move skips per timeline: more than any one job can have been
-- given by a primary after its last WAL that reached the standby. Each attempt a primary hands
-- out costs at least two commits of the job's row (the claim and the outcome, ~0.5 kB of WAL
-- together), so 100000 attempts of one job are ~50 MB of WAL that never reached the standby;
-- Patroni refuses to promote a replica that lags more than maximum_lag_on_failover (1 MB by
-- default). With integer attempts, a job can be moved ~21000 times.
CREATE FUNCTION pgq._fence_step() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 100000 $$;

-- The slow path of the fence check in pgq.claim, once per session: when the fences were last
-- moved on another timeline (this server was promoted, or restored), moves them now. In one
-- transaction that locks the fence row (so concurrent first claims take turns, and the later
-- ones find the work done), every job that is not done gets attempt_skip raised by
-- _fence_step() per timeline passed: its next claim issues attempt + 1 + attempt_skip, and
-- max_attempts rises by the same amount (the attempts left stay the same), so no number the
-- old primary handed out is issued again. A job running here keeps its attempt: this server's
-- record of it is the claim that handed that number out, once, to the owner that holds it.
-- Done jobs are final and never claimed again; failed and cancelled ones may be retried, so
-- they are moved too. Marks the session as checked (the setting pgq.fence, which a transaction
-- that rolls back also rolls back): a session never outlives a timeline change.
CREATE FUNCTION pgq._check_timeline() RETURNS void
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
    PERFORM set_config('pgq.fence', current_timeline::text, false);
END
$$;

-- Functions: producers ----------------------------------------------------------------------------

-- The dependencies of a job being enqueued (pgq.enqueue's and pgq.enqueue_many's depends_on),
-- checked and locked. Each row is updated (has_dependants, which arms its trigger) in id order,
-- so a concurrent end of a dependency either committed first (and its state is read here) or
-- waits for this transaction and then sees the new job's link (an end under REPEATABLE READ or
-- SERIALIZABLE fails with 40001 instead: the row was updated). A job of a queue whose read
-- grants do not admit the login counts as absent, like in pgq.get_job. Returns the distinct ids
-- in order, those not done yet (the new job waits for them) and the first that ended failed or
-- cancelled (the new job is then cancelled at once), with its state.
CREATE FUNCTION pgq._lock_dependencies(depends_on bigint[], OUT ids bigint[], OUT open_ids bigint[],
                                       OUT ended_id bigint, OUT ended_state pgq.job_state)
    LANGUAGE plpgsql
    AS $$
DECLARE
    missing bigint;
BEGIN
    IF array_ndims(_lock_dependencies.depends_on) > 1 THEN
        PERFORM pgq._bad_argument('depends_on', 'must be a one-dimensional array of job ids');
    ELSIF array_position(_lock_dependencies.depends_on, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', 'must not contain NULL');
    END IF;
    ids := ARRAY(SELECT DISTINCT d.id FROM unnest(_lock_dependencies.depends_on) AS d(id) ORDER BY d.id);
    IF cardinality(ids) > 10000 THEN
        PERFORM pgq._bad_argument('depends_on', format('must name at most 10000 jobs, got %s', cardinality(ids)),
            'A job that waits for more: enqueue it after an intermediate job that waits for the rest.');
    END IF;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    -- Locked in id order (so concurrent enqueues never deadlock on them), then updated.
    PERFORM FROM pgq.jobs AS j WHERE j.id = ANY (ids) ORDER BY j.id FOR NO KEY UPDATE;
    WITH locked AS (
        UPDATE pgq.jobs AS j SET has_dependants = true
        WHERE j.id = ANY (ids)
        RETURNING j.id, j.state, j.queue
    ), seen AS (
        SELECT l.id, l.state FROM locked AS l JOIN pgq.queues AS q ON q.name = l.queue
        WHERE q.restricted IS NULL OR pgq._may(q.name, q.restricted, 'read')
    )
    SELECT (SELECT min(i.id) FROM unnest(ids) AS i(id) WHERE i.id NOT IN (SELECT s.id FROM seen AS s)),
           ARRAY(SELECT s.id FROM seen AS s WHERE s.state NOT IN ('done', 'failed', 'cancelled') ORDER BY s.id),
           (SELECT s.id FROM seen AS s WHERE s.state IN ('failed', 'cancelled') ORDER BY s.id LIMIT 1)
    INTO missing, open_ids, ended_id;
    IF missing IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', format('names no job with id %s', missing),
            'A job that never existed, or a finished one that pgq.prune has deleted (after its queue''s '
            'retention), cannot be depended on.');
    END IF;
    IF ended_id IS NOT NULL THEN
        ended_state := (SELECT j.state FROM pgq.jobs AS j WHERE j.id = ended_id);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq._lock_dependencies(bigint[]) IS
    'For pgq.enqueue''s depends_on: checks and locks the dependencies; returns them, those not done '
    'yet and the first that ended failed or cancelled.';

-- Cancels a waiting job whose dependency `dependency` has ended `ended` (failed or cancelled):
-- for pgq.enqueue and pgq.enqueue_many, when a dependency had ended before the job was enqueued
-- (pgq._dependency_ended cancels the jobs already waiting).
CREATE FUNCTION pgq._cancel_for_dependency(ids bigint[], dependency bigint, ended pgq.job_state)
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

CREATE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL, concurrency_key text DEFAULT NULL,
                            depends_on bigint[] DEFAULT NULL)
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
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
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
                    AND pgq._jsonb_size(enqueue.payload) <= 1048576
                    AND coalesce(octet_length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days'
                                 AND pgq._is_span(enqueue.max_run_time), true)
                    AND (enqueue.meta IS NULL OR jsonb_typeof(enqueue.meta) = 'object'
                         AND pgq._jsonb_size(enqueue.meta) <= 1048576)
                    AND coalesce(length(enqueue.concurrency_key) BETWEEN 1 AND 256, true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_concurrency_key('concurrency_key', enqueue.concurrency_key);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
        IF enqueue.meta IS NOT NULL THEN
            PERFORM pgq._check_payload('meta', enqueue.meta);
        END IF;
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue.queue));
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
    -- With dependencies: waiting for those not done yet (locked by pgq._lock_dependencies until
    -- this transaction ends, so none of them ends unseen), or cancelled at once (below) when one
    -- has ended failed or cancelled. An empty array is no dependency. A live job that holds the
    -- unique_key is answered first, so that a deduplicated call writes nothing here either.
    IF enqueue.depends_on IS NOT NULL THEN
        IF enqueue.unique_key IS NOT NULL THEN
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END IF;
        deps := pgq._lock_dependencies(enqueue.depends_on);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time, meta, concurrency_key, state, depends_on,
                                   dependencies_left)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta, enqueue.concurrency_key, new_state, dep_ids, left_count)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time, meta, concurrency_key,
                                       state, depends_on, dependencies_left)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time, enqueue.meta, enqueue.concurrency_key, new_state, dep_ids,
                    left_count)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('waiting', 'pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF new_state = 'waiting' THEN
        IF deps.ended_id IS NOT NULL THEN
            -- A dependency has ended failed or cancelled: the job ends as if it had been waiting then.
            PERFORM pgq._cancel_for_dependency(ARRAY[new_id], deps.ended_id, deps.ended_state);
        ELSE
            INSERT INTO pgq.job_dependencies (depends_on, job_id)
            SELECT d.id, new_id FROM unnest(deps.open_ids) AS d(id);
        END IF;
        RETURN new_id;
    END IF;
    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[]) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it. '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim. depends_on: the job '
    'waits until those jobs are done (cancelled if one fails or is cancelled).';

CREATE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL,
                                 concurrency_key text DEFAULT NULL, depends_on bigint[] DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
    new_ids    bigint[];
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant);
    IF enqueue_many.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', enqueue_many.max_run_time, interval '365 days');
    END IF;
    IF enqueue_many.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', enqueue_many.meta);
    END IF;
    PERFORM pgq._check_concurrency_key('concurrency_key', enqueue_many.concurrency_key);
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pgq._jsonb_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue_many.queue));
    q := pgq._queue(enqueue_many.queue);
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;
    -- The same dependencies for every job, as in pgq.enqueue.
    IF enqueue_many.depends_on IS NOT NULL THEN
        deps := pgq._lock_dependencies(enqueue_many.depends_on);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF new_state = 'pending' THEN
        -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
        -- the ids in payload order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                                  meta, concurrency_key, depends_on, dependencies_left)
            SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
                   enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
                   job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
                   dep_ids, left_count
            FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
            ORDER BY p.n
            RETURNING jobs.id
        )
        SELECT i.id FROM inserted AS i ORDER BY i.id;

        IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
            PERFORM pg_notify('pgq', enqueue_many.queue);
        END IF;
        RETURN;
    END IF;

    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                              meta, concurrency_key, state, depends_on, dependencies_left)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
               'waiting', dep_ids, left_count
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') INTO new_ids FROM inserted AS i;
    IF deps.ended_id IS NOT NULL THEN
        PERFORM pgq._cancel_for_dependency(new_ids, deps.ended_id, deps.ended_state);
    ELSE
        INSERT INTO pgq.job_dependencies (depends_on, job_id)
        SELECT d.id, n.id FROM unnest(deps.open_ids) AS d(id) CROSS JOIN unnest(new_ids) AS n(id);
    END IF;
    RETURN QUERY SELECT unnest(new_ids);
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[]) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta and the same depends_on.';

-- Functions: workers ------------------------------------------------------------------------------

CREATE TYPE pgq.claimed_job AS (
    id            bigint,
    queue         text,
    kind          text,
    payload       jsonb,
    priority      integer,
    attempt       integer,
    max_attempts  integer,
    run_at        timestamptz,
    created_at    timestamptz,
    lease_until   timestamptz,
    tenant        text,
    progress      jsonb,
    deadline      timestamptz,
    meta          jsonb
);
COMMENT ON TYPE pgq.claimed_job IS
    'What pgq.claim hands a worker: the job, its fencing token (attempt), the checkpoint an '
    'earlier attempt recorded (progress), the attempt''s deadline (NULL: no limit) and the '
    'producer''s metadata (meta).';

-- Fair mode's pick for one queue: up to `room` claimable jobs, locked FOR NO KEY UPDATE SKIP
-- LOCKED, chosen across the queue's tenants by weighted round-robin. Tenants with a due job are
-- ranked by virtual time (jobs started / weight); the k-th job of a tenant counts as finishing at
-- vtime + k/weight, and the earliest finishers win (ties: the total order). The winners' tenants
-- then advance their virtual time. A tenant that was idle restarts no further behind the busiest
-- one (the largest virtual time of the queue's tenants) than one round, so it gets its share, not
-- a burst. With `kinds`, only jobs of those kinds count (a filter within each tenant's jobs).
-- The cost is bounded by the tenants served, not the tenants waiting: one probe says whether the
-- queue has a claimable job at all, one reads the busiest tenant (the top of tenants_vtime_idx),
-- and the `room` least-served tenants with a claimable job are walked from the bottom, each
-- checked by one probe (so tenants without one that are passed over cost a probe each: pgq.prune
-- removes tenants without jobs). Tenants behind the busiest by more than a round all start at
-- busiest - 1 and are served in virtual-time order, then by name.
-- The winners' tenant rows are locked for the last update with SKIP LOCKED: a tenant another
-- claimer holds (an idle transaction that claimed from this queue, say) is left for this call,
-- with its picked jobs, instead of waited for; so no claimer waits for another or deadlocks.
-- A key-limited queue's pick (pgq._keyed_pick) passes the keys that are full (skip_keys) and the
-- jobs it already holds (skip_ids); NULL for the others.
CREATE FUNCTION pgq._fair_pick(queue text, room integer, kinds text[] DEFAULT NULL,
                               skip_keys text[] DEFAULT NULL, skip_ids bigint[] DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    busiest double precision;
    picked bigint[];
    served text[];
BEGIN
    IF NOT EXISTS (SELECT FROM pgq.jobs AS j
                   WHERE j.queue = _fair_pick.queue AND j.state = 'pending' AND j.attempt < j.max_attempts
                     AND j.run_at <= pgq._now()
                     AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                     AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                          OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                     AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids))) THEN
        RETURN;  -- no claimable job: no tenant needs to be read
    END IF;
    SELECT t.vtime INTO busiest
    FROM pgq.tenants AS t
    WHERE t.queue = _fair_pick.queue
    ORDER BY t.vtime DESC
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;  -- no tenant
    END IF;

    picked := ARRAY(
        WITH ranked AS (
            SELECT t.tenant, t.weight, greatest(t.vtime, busiest - 1) AS vstart
            FROM pgq.tenants AS t
            WHERE t.queue = _fair_pick.queue
              AND EXISTS (SELECT FROM pgq.jobs AS j
                          WHERE j.queue = t.queue AND j.tenant = t.tenant
                            AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                            AND j.run_at <= pgq._now()
                            AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                            AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                                 OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                            AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids)))
            ORDER BY t.vtime, t.tenant
            LIMIT _fair_pick.room
        )
        SELECT c.id
        FROM ranked AS r
        CROSS JOIN LATERAL (
            SELECT x.id, x.priority, x.run_at,
                   row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS k
            FROM (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = _fair_pick.queue AND j.tenant = r.tenant
                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                  AND j.run_at <= pgq._now()
                  AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                  AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                       OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                  AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids))
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT _fair_pick.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS x
        ) AS c
        ORDER BY r.vstart + c.k::float8 / r.weight, c.priority DESC, c.run_at, c.id
        LIMIT _fair_pick.room);

    -- (The tenants as arrays, so that both statements read them by primary key: joined, the
    -- generic plan read every tenant of the queue.)
    served := ARRAY(SELECT t.tenant FROM pgq.tenants AS t
                    WHERE t.queue = _fair_pick.queue
                      AND t.tenant = ANY (ARRAY(SELECT j.tenant FROM pgq.jobs AS j WHERE j.id = ANY (picked)))
                    FOR NO KEY UPDATE SKIP LOCKED);
    picked := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (picked) AND j.tenant = ANY (served));
    UPDATE pgq.tenants AS t
    SET vtime = greatest(t.vtime, busiest - 1) + s.n::float8 / t.weight
    FROM (SELECT j.tenant, count(*) AS n FROM pgq.jobs AS j WHERE j.id = ANY (picked) GROUP BY j.tenant) AS s
    WHERE t.queue = _fair_pick.queue AND t.tenant = ANY (served) AND t.tenant = s.tenant;

    RETURN QUERY SELECT unnest(picked);
END
$$;

-- A key-limited queue's pick (queues.key_limited): up to `room` claimable jobs in the total order
-- (or by fair mode's round-robin), of which at most as many per concurrency_key as the key has
-- free slots (its limit, pgq.key_limits or the queue's key_max_running, less its running jobs);
-- jobs without a key, or of a key without a limit, are not limited. A full key is left out of the
-- scan, so it never blocks the keys behind it. Race-free because the claim holds the queue's row
-- (FOR NO KEY UPDATE, as for max_running) before this counts the running jobs in a fresh snapshot:
-- claimers of a key-limited queue take turns. Each pass reads the next candidates past the full
-- keys; a pass that fills a key reads again without it, so at most `room` passes (for a fair
-- queue, one job per _fair_pick call). Returns the picked ids, locked FOR NO KEY UPDATE.
-- A queue with key_rate_limit also counts each key's tokens at `at` (the claim's rate clock): a
-- key without one is left out like a full key. A rate-limited queue without a per-key step
-- (pgq.queues.rate_limited only) gets its first `room` jobs, locked, or its fair pick.
CREATE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean,
                                at timestamptz DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    default_limit integer;
    key_limited boolean;       -- queues.key_limited
    key_rate  integer;         -- queues.key_rate_limit (0: none), per period
    period    interval;        -- queues.rate_period
    slots    jsonb;            -- key -> free slots, for the limited keys with running jobs
    avail    jsonb := '{}';    -- key -> how many more of its jobs this call may pick, for the keys met
    full_keys text[];          -- the keys without a free slot (or, with key_rate, without a token)
    picked   bigint[] := '{}';
    filled   boolean;          -- whether this pass filled a key
    before   integer;          -- how many were picked before this pass
    r        record;
    n        integer;
BEGIN
    SELECT q.key_max_running, q.key_limited, q.key_rate_limit, q.rate_period
    INTO default_limit, key_limited, key_rate, period
    FROM pgq.queues AS q WHERE q.name = _keyed_pick.queue;
    IF NOT key_limited AND key_rate = 0 THEN
        -- A rate-limited queue without a per-key step: its first jobs (its fair pick), locked.
        IF _keyed_pick.fair THEN
            RETURN QUERY SELECT f.id FROM pgq._fair_pick(_keyed_pick.queue, _keyed_pick.room, _keyed_pick.kinds) AS f(id);
        ELSE
            RETURN QUERY
            SELECT j.id FROM pgq.jobs AS j
            WHERE j.queue = _keyed_pick.queue
              AND j.state = 'pending' AND j.attempt < j.max_attempts
              AND j.run_at <= pgq._now()
              AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT _keyed_pick.room
            FOR NO KEY UPDATE SKIP LOCKED;
        END IF;
        RETURN;
    END IF;
    SELECT coalesce(jsonb_object_agg(c.key, coalesce(l.max_running, default_limit) - c.n), '{}')
    INTO slots
    FROM (SELECT j.concurrency_key AS key, count(*)::integer AS n
          FROM pgq.jobs AS j
          WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS c
    LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = c.key
    WHERE coalesce(l.max_running, default_limit) > 0;
    full_keys := ARRAY(SELECT e.key FROM jsonb_each(slots) AS e(key, value) WHERE e.value::integer <= 0);
    IF key_rate > 0 THEN
        -- The keys without a token (key_rates_tat_idx: those whose tat is furthest ahead), so that
        -- each key a pass meets has at least one.
        full_keys := full_keys || ARRAY(
            SELECT k.key FROM pgq.key_rates AS k
            WHERE k.queue = _keyed_pick.queue
              AND k.tat > _keyed_pick.at + period - period / key_rate - interval '1 microsecond'
              AND pgq._tokens(k.tat, key_rate, period, _keyed_pick.at) < 1);
        -- The others' tokens are read as their keys come (the passes' tat column).
    END IF;
    LOOP
        filled := false;
        before := cardinality(picked);
        FOR r IN
            SELECT x.id, x.key, coalesce(l.max_running, default_limit) AS max_running, k.tat
            FROM pgq._fair_pick(_keyed_pick.queue, 1, _keyed_pick.kinds, full_keys, picked) AS f(id)
            JOIN LATERAL (SELECT j.id, j.concurrency_key AS key FROM pgq.jobs AS j WHERE j.id = f.id) AS x ON true
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key
            LEFT JOIN pgq.key_rates AS k ON k.queue = _keyed_pick.queue AND k.key = x.key AND key_rate > 0
            WHERE _keyed_pick.fair
            UNION ALL
            SELECT x.id, x.key, coalesce(l.max_running, default_limit), k.tat
            FROM (SELECT j.id, j.concurrency_key AS key, j.priority, j.run_at
                  FROM pgq.jobs AS j
                  WHERE j.queue = _keyed_pick.queue
                    AND j.state = 'pending' AND j.attempt < j.max_attempts
                    AND j.run_at <= pgq._now()
                    AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
                    AND (j.concurrency_key IS NULL OR j.concurrency_key <> ALL (full_keys))
                    AND j.id <> ALL (picked)
                  ORDER BY j.priority DESC, j.run_at, j.id
                  LIMIT _keyed_pick.room - cardinality(picked)) AS x
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key
            LEFT JOIN pgq.key_rates AS k ON k.queue = _keyed_pick.queue AND k.key = x.key AND key_rate > 0
            WHERE NOT _keyed_pick.fair
        LOOP
            IF r.key IS NULL OR (r.max_running = 0 AND key_rate = 0) THEN
                picked := picked || r.id;
            ELSIF r.key <> ALL (full_keys) THEN  -- (a key this pass filled: its later jobs wait)
                n := (avail ->> r.key)::integer;
                IF n IS NULL THEN  -- the key's first job in this call: its free slots, its tokens
                    n := least(CASE WHEN r.max_running > 0 THEN coalesce((slots ->> r.key)::integer, r.max_running) END,
                               CASE WHEN key_rate > 0 THEN pgq._tokens(r.tat, key_rate, period, _keyed_pick.at) END);
                END IF;
                IF n > 0 THEN
                    picked := picked || r.id;
                    n := n - 1;
                END IF;
                avail := avail || jsonb_build_object(r.key, n);
                IF n <= 0 THEN
                    full_keys := full_keys || r.key;
                    filled := true;
                END IF;
            END IF;
        END LOOP;
        -- A plain pass that filled no key took every job it read: all there are, or enough. A fair
        -- pass reads one job (never of a full key): it goes on while there was one.
        EXIT WHEN cardinality(picked) >= _keyed_pick.room
                  OR CASE WHEN _keyed_pick.fair THEN cardinality(picked) = before AND NOT filled ELSE NOT filled END;
    END LOOP;
    -- The picks of the plain pass are locked here, re-checked on the newest row version (a job
    -- cancelled meanwhile, or one another session holds, is left out); _fair_pick locked its own.
    RETURN QUERY
    SELECT j.id FROM pgq.jobs AS j
    WHERE j.id = ANY (picked) AND j.state = 'pending' AND j.attempt < j.max_attempts
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED;
END
$$;

-- For pgq.claim, which holds the queues' rows: spends the tokens of the rate-limited queues (and
-- keys) for those of `ids` (its picks) that it handed out, at the rate clock's reading `at`.
CREATE FUNCTION pgq._spend_tokens(ids bigint[], at timestamptz) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    UPDATE pgq.queues AS q
    SET rate_tat = pgq._tat_after(q.rate_tat, q.rate_limit, q.rate_period, _spend_tokens.at, c.n)
    FROM (SELECT j.queue, count(*)::integer AS n FROM pgq.jobs AS j
          WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running'
          GROUP BY j.queue) AS c
    WHERE q.name = c.queue AND q.rate_limit > 0;
    INSERT INTO pgq.key_rates AS k (queue, key, tat)
    SELECT c.queue, c.key, pgq._tat_after(NULL, q.key_rate_limit, q.rate_period, _spend_tokens.at, c.n)
    FROM (SELECT j.queue, j.concurrency_key AS key, count(*)::integer AS n FROM pgq.jobs AS j
          WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running' AND j.concurrency_key IS NOT NULL
          GROUP BY j.queue, j.concurrency_key) AS c
    JOIN pgq.queues AS q ON q.name = c.queue
    WHERE q.key_rate_limit > 0
    -- (excluded.tat is at + n * period / rate: greatest(k.tat, at) + the same.)
    ON CONFLICT ON CONSTRAINT key_rates_pkey
        DO UPDATE SET tat = excluded.tat + greatest(k.tat - _spend_tokens.at, interval '0');
END
$$;

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
-- Which queues: the named ones; with queues => NULL, the queues that have a pending job (a skip
-- scan of jobs_ready_idx: one index probe per such queue, so queues without jobs cost nothing,
-- however many exist) or a due schedule (queues_schedule_due_idx), unpaused.
-- Three queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- a fair queue's candidates come from pgq._fair_pick, and a key-limited queue (key_max_running or
-- pgq.set_key_limit) is locked the same way and its candidates come from pgq._keyed_pick (at
-- most each key's free slots). Queues with none of them pay nothing for them.
-- A claim never waits for another session's lock: a capped queue's row (or a fair queue's tenant
-- row) that another transaction holds is skipped for this call (SKIP LOCKED), so an idle
-- transaction that claimed from a capped queue holds up no other worker's claims.
-- Before any of that, the failover fence: the first claim of a session checks that the fences
-- were moved on this server's timeline (pgq._check_timeline); later ones read one setting.
CREATE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
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
    keyeds   boolean[];  -- whether each takes the per-key step (queues.key_limited or rate_limited)
    fair_ids bigint[] := '{}';
    keyed_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running, key limits or rate limits
    rated    boolean;    -- then: whether any of those it holds has a rate limit
    rate_now timestamptz;  -- then: the rate limits' clock, read once they are held
    locked   text[];     -- then: the capped ones this call holds (the others are skipped)
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
    -- skips that match); the joined names hold exactly one comma fewer than there are names (a
    -- name 'a,b' would otherwise pass as two). Only a bad name pays for the per-name check that
    -- names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
           AND length(array_to_string(claim.queues, ',')) - length(replace(array_to_string(claim.queues, ','), ',', ''))
               = cardinality(claim.queues) - 1
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
               AND length(array_to_string(claim.kinds, ',')) - length(replace(array_to_string(claim.kinds, ','), ',', ''))
                   = cardinality(claim.kinds) - 1
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
    -- probes for expired leases (one index probe). With queues => NULL the candidates are the
    -- queues that have a pending job, found by a skip scan of jobs_ready_idx (the next queue name
    -- after the last, one index probe each: queues without jobs are never read), and those with a
    -- due schedule (queues_schedule_due_idx).
    FOR pass IN 1..2 LOOP
        SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
               coalesce(bool_or(q.max_running > 0 OR q.key_limited OR q.rate_limited), false),
               EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
               coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
        INTO names, fairs, capped, expired, due
        FROM pgq.queues AS q
        WHERE NOT q.paused
          AND q.name = ANY (coalesce(claim.queues, ARRAY(
                  WITH RECURSIVE pending(name) AS (
                      (SELECT j.queue FROM pgq.jobs AS j
                       WHERE j.state = 'pending' AND j.attempt < j.max_attempts
                       ORDER BY j.queue LIMIT 1)
                      UNION ALL
                      SELECT (SELECT j.queue FROM pgq.jobs AS j
                              WHERE j.queue > p.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                              ORDER BY j.queue LIMIT 1)
                      FROM pending AS p WHERE p.name IS NOT NULL
                  )
                  SELECT p.name FROM pending AS p WHERE p.name IS NOT NULL
                  UNION ALL
                  SELECT u.name FROM pgq.queues AS u WHERE u.next_schedule_at <= pgq._now())))
          -- A queue with grants admits only some logins (a named one raises 42501 for the others).
          AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL));

        -- Expired leases are recovered first, so their jobs are claimable by this very claim
        -- (with queues => NULL, their queues are candidates only once recovered: read again).
        EXIT WHEN pass = 2 OR NOT expired;
        PERFORM pgq._recover_expired(100);
        EXIT WHEN claim.queues IS NOT NULL;
    END LOOP;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
        keyeds := array_fill(false, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked before their running jobs are counted by the next statement,
        -- whose fresh snapshot sees every earlier claim; one that another transaction holds is
        -- skipped (this call claims none of its jobs), never waited for. (Under REPEATABLE READ or
        -- SERIALIZABLE that count would come from an older snapshot and could pass the cap: such
        -- a claim of a capped queue is refused.)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running, key limits or rate limits must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;
        locked := ARRAY(SELECT q.name FROM pgq.queues AS q
                        WHERE (q.max_running > 0 OR q.key_limited OR q.rate_limited) AND NOT q.paused
                          AND q.name = ANY (names)
                        FOR NO KEY UPDATE SKIP LOCKED);
        -- The rate limits' clock, read once their queues are held (see pgq._rate_clock).
        rate_now := pgq._rate_clock();

        -- A rate-limited queue's room is at most the tokens its bucket holds now; it takes the
        -- per-key step (pgq._keyed_pick), whose picks are known before the claim, so that the
        -- tokens spent are those of the jobs handed out (counted after it).
        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name), array_agg(e.keyed ORDER BY e.name),
               coalesce(bool_or(e.rate_limited), false)
        INTO names, rooms, fairs, keyeds, rated
        FROM (
            SELECT q.name, q.fair, q.key_limited OR q.rate_limited AS keyed, q.rate_limited,
                   least(CASE WHEN q.max_running = 0 THEN claim.batch
                              ELSE least(claim.batch, q.max_running - (
                                       SELECT count(*) FROM pgq.jobs AS j
                                       WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                         END,
                         CASE WHEN q.rate_limit > 0 THEN pgq._tokens(q.rate_tat, q.rate_limit, q.rate_period, rate_now) END)
                   AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND q.name = ANY (names)
              AND ((q.max_running = 0 AND NOT q.key_limited AND NOT q.rate_limited) OR q.name = ANY (locked))
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
                          FROM unnest(names, rooms, fairs, keyeds) AS e(name, room, fair, keyed)
                          CROSS JOIN LATERAL pgq._fair_pick(e.name, e.room, claim.kinds) AS f(id)
                          WHERE e.fair AND NOT e.keyed);
    END IF;
    IF true = ANY (keyeds) THEN
        keyed_ids := ARRAY(SELECT f.id
                           FROM unnest(names, rooms, fairs, keyeds) AS e(name, room, fair, keyed)
                           CROSS JOIN LATERAL pgq._keyed_pick(e.name, e.room, claim.kinds, e.fair, rate_now) AS f(id)
                           WHERE e.keyed);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- For each eligible queue, its first claimable jobs in index order (up to its room);
        -- with the fair queues' picks, the best `batch` of those across queues.
        SELECT c.id
        FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs, keyeds) AS e(queue, room, fair, keyed)
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
            WHERE NOT e.fair AND NOT e.keyed AND claim.kinds IS NULL
            UNION ALL
            -- The same per (queue, kind) when the worker named its kinds (each kind once; no
            -- rows for NULL). Inside this one statement: a query of its own would cost a claim
            -- more than the per-kind picks do.
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs, keyeds) AS e(queue, room, fair, keyed)
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
            WHERE NOT e.fair AND NOT e.keyed
            UNION ALL
            -- The fair and the key-limited queues' picks (pgq._fair_pick, pgq._keyed_pick).
            SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (fair_ids || keyed_ids)
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
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, j.meta,
                  q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline, c.meta
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;

    -- The rate-limited queues' tokens, spent for the jobs this claim handed out: its picks
    -- (locked by it, pending until its UPDATE) that are running now.
    IF rated THEN
        PERFORM pgq._spend_tokens(keyed_ids, rate_now);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

CREATE FUNCTION pgq.renew(id bigint, attempt integer, lease interval DEFAULT NULL)
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

CREATE FUNCTION pgq.complete(id bigint, attempt integer, result jsonb DEFAULT NULL)
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
    IF pgq._jsonb_size(complete.result) > 1048576 THEN
        PERFORM pgq._bad_argument('result',
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(complete.result)),
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

CREATE FUNCTION pgq.complete_many(ids bigint[], attempts integer[])
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
    -- diagnosed from pgq.job_events whichever call the worker used; a pair repeated in the call
    -- (or rejected before) is recorded once, with the number of times (pgq._reject).
    PERFORM pgq._reject(r.id, r.attempt, 'complete_many', r.times::integer)
    FROM (SELECT w.id, w.attempt, count(*) AS times
          FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
          JOIN pgq.jobs AS j ON j.id = w.id AND j.id = ANY (complete_many.ids)
          JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
          WHERE NOT (j.attempt = w.attempt AND j.state = 'done' AND j.last_event = 'completed'
                     AND pgq._same_login(j.session_role))
          GROUP BY w.id, w.attempt
          ORDER BY w.id, w.attempt) AS r;

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

CREATE FUNCTION pgq.fail(id bigint, attempt integer, error text, retry_in interval DEFAULT NULL,
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
CREATE FUNCTION pgq.release(id bigint, attempt integer)
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
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
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
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(release.id, 'release');
    END IF;
    PERFORM pgq._reject(release.id, release.attempt, 'release');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.release(bigint, integer) IS
    'Gives an unstarted job back (pending now, the attempt not counted); false when not yours.';

-- Puts a job back to sleep for `delay`; the snooze does not use up an attempt.
CREATE FUNCTION pgq.snooze(id bigint, attempt integer, delay interval)
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
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
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
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(snooze.id, 'snooze');
    END IF;
    PERFORM pgq._reject(snooze.id, snooze.attempt, 'snooze');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.snooze(bigint, integer, interval) IS
    'Pending again after delay without using an attempt; returns the new run_at, NULL when not yours.';

-- The outside effect's outcome is unknown (a timeout after the request was sent, say): park the
-- job instead of retrying blindly. pgq.resolve settles it once someone knows.
CREATE FUNCTION pgq.mark_unknown(id bigint, attempt integer, note text)
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
CREATE FUNCTION pgq.progress(id bigint, attempt integer, progress jsonb)
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

CREATE FUNCTION pgq.sweep(max_jobs integer DEFAULT 1000)
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
    IF sweep.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF sweep.max_jobs NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 100000, got %s', sweep.max_jobs));
    END IF;
    FOR r IN SELECT x.queue, x.recovered FROM pgq._recover_expired(sweep.max_jobs) AS x LOOP
        total := total + r.recovered;
        IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = r.queue) THEN
            PERFORM pg_notify('pgq', r.queue);
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now()) THEN
        PERFORM pgq._fire_schedules(sweep.max_jobs);
    END IF;
    -- Keeps pgq.finished_deltas short where no exporter calls pgq.metrics().
    PERFORM pgq._fold_finished();
    -- Forgets the per-key rate limits' buckets that are full again.
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(sweep.max_jobs);
    END IF;
    RETURN total;
END
$$;
COMMENT ON FUNCTION pgq.sweep(integer) IS
    'Recovers up to max_jobs running jobs whose lease expired or whose attempt timed out (returns '
    'how many), and fires up to max_jobs due schedules.';

-- Functions: admin --------------------------------------------------------------------------------
--
-- Every admin call runs with lock_timeout 5 s (its SET clause, whatever the session's): a lock
-- another session holds (an idle transaction that claimed from a capped queue holds that queue's
-- row; one that claimed a job holds the job's row) is waited for at most that long, then the call
-- fails with 55P03, with a hint when it was a queue row (pgq._lock_queue).

-- The job row for an admin call, locked; raises P0002 for an unknown id.
CREATE FUNCTION pgq._admin_job(id bigint) RETURNS pgq.jobs
    LANGUAGE plpgsql
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF _admin_job.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = _admin_job.id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgq: no job with id %', _admin_job.id
            USING ERRCODE = 'no_data_found', HINT = 'It may have been pruned.';
    END IF;
    RETURN job;
END
$$;

CREATE FUNCTION pgq._admin_event(job pgq.jobs, event text, to_state pgq.job_state, note text DEFAULT NULL)
    RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT (job).id, (job).attempt, NULL, event, (job).state, to_state, note
    FROM pgq.queues AS q WHERE q.name = (job).queue AND q.audit
$$;

-- Cancels a waiting, pending, running or outcome_unknown job (and the jobs waiting for it:
-- pgq._dependency_ended). A running job's owner learns it at its next
-- renew or complete (answered "not yours"). Returns false, changing nothing, when the job had
-- already finished.
CREATE FUNCTION pgq.cancel(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(cancel.id);
BEGIN
    IF job.state IN ('done', 'failed', 'cancelled') THEN
        RETURN false;
    END IF;
    UPDATE pgq.jobs AS j
    SET state = 'cancelled', lease_until = NULL, finished_at = pgq._now(), last_event = 'cancelled'
    WHERE j.id = cancel.id;
    PERFORM pgq._admin_event(job, 'cancelled', 'cancelled');
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.cancel(bigint) IS
    'Cancels a job that has not finished; false when it had already finished; P0002 when unknown.';

-- Runs a failed or cancelled job again, now. The attempt number is kept (it never decreases);
-- max_attempts is raised so that at least one more attempt is allowed.
CREATE FUNCTION pgq.retry(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(retry.id);
BEGIN
    IF job.state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgq: job % is %, only failed or cancelled jobs can be retried', retry.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Use pgq.resolve for outcome_unknown jobs.';
    END IF;
    IF greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(retry.id, 'retry');
    END IF;
    BEGIN
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), finished_at = NULL,
            max_attempts = greatest(j.max_attempts, j.attempt + 1), last_event = 'retried'
        WHERE j.id = retry.id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'pgq: job % cannot be retried: job % holds its unique_key %', retry.id,
            (SELECT j.id FROM pgq.jobs AS j
             WHERE j.queue = job.queue AND j.unique_key = job.unique_key
               AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')),
            quote_literal(job.unique_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that job to finish, or cancel it first.';
    END;
    PERFORM pgq._admin_event(job, 'retried', 'pending');
    PERFORM pgq._notify(job.queue);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.retry(bigint) IS
    'Makes a failed or cancelled job pending again; 55000 for other states; P0002 when unknown.';

-- Settles an outcome_unknown job once the outside effect's fate is known: done (it happened),
-- failed or cancelled (give up), or pending (it did not happen: run it again).
CREATE FUNCTION pgq.resolve(id bigint, state text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF resolve.state IS NULL THEN
        PERFORM pgq._bad_argument('state', 'must not be NULL');
    ELSIF resolve.state NOT IN ('done', 'failed', 'cancelled', 'pending') THEN
        PERFORM pgq._bad_argument('state',
            format('must be done, failed, cancelled or pending, got %s', left(quote_literal(resolve.state), 40)));
    END IF;
    job := pgq._admin_job(resolve.id);
    IF job.state <> 'outcome_unknown' THEN
        RAISE EXCEPTION 'pgq: job % is %, only outcome_unknown jobs can be resolved', resolve.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF resolve.state = 'pending'
       AND greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(resolve.id, 'resolve');
    END IF;
    UPDATE pgq.jobs AS j
    SET state = resolve.state::pgq.job_state,
        finished_at = CASE WHEN resolve.state = 'pending' THEN NULL ELSE pgq._now() END,
        run_at = CASE WHEN resolve.state = 'pending' THEN pgq._now() ELSE j.run_at END,
        max_attempts = CASE WHEN resolve.state = 'pending' THEN greatest(j.max_attempts, j.attempt + 1)
                            ELSE j.max_attempts END,
        last_event = 'resolved'
    WHERE j.id = resolve.id;
    PERFORM pgq._admin_event(job, 'resolved', resolve.state::pgq.job_state);
    IF resolve.state = 'pending' THEN
        PERFORM pgq._notify(job.queue);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.resolve(bigint, text) IS
    'Settles an outcome_unknown job as done, failed, cancelled or pending (run again).';

-- Deletes finished (done, failed, cancelled) jobs, with their events, older than older_than, or
-- than each queue's retention when older_than is NULL. At most max_jobs per call: call it again
-- until it returns 0. Then removes up to max_jobs tenants of fair queues that have no job left and
-- the default weight 1 (a weight set with pgq.set_tenant_weight is kept; a tenant removed comes
-- back with its next job, one round behind the busiest as after any idle time). A queue whose
-- writer lock an enqueue holds is left for the next call: its new job may be one of those tenants'.
CREATE FUNCTION pgq.prune(older_than interval DEFAULT NULL, max_jobs integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    deleted integer;
    tenants_left integer;
    r record;
BEGIN
    -- Bounded like queues.retention: a huge interval would make now() - older_than leave the
    -- timestamp range and fail with an unrelated 22008.
    PERFORM pgq._check_span('older_than', prune.older_than);
    IF prune.older_than < interval '0' OR prune.older_than > interval '3650 days' THEN
        PERFORM pgq._bad_argument('older_than',
            format('must be between 0 and 3650 days, got %s', prune.older_than));
    END IF;
    IF prune.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF prune.max_jobs NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 1000000, got %s', prune.max_jobs));
    END IF;
    WITH doomed AS (
        SELECT j.id
        FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue
        WHERE j.state IN ('done', 'failed', 'cancelled')
          AND j.finished_at < pgq._now() - coalesce(prune.older_than, q.retention)
        ORDER BY j.finished_at
        LIMIT prune.max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ), gone AS (
        DELETE FROM pgq.jobs AS j USING doomed AS d WHERE j.id = d.id RETURNING j.id
    ), events AS (
        DELETE FROM pgq.job_events AS e USING gone AS g WHERE e.job_id = g.id
    )
    SELECT count(*) INTO deleted FROM gone;

    -- Idle tenants, queue by queue under the queue's writer lock, taken without waiting and held
    -- (a session lock) only while they are deleted: an enqueue that read a tenant's row before
    -- has committed its job (or holds the lock still, and the queue is skipped); one that comes
    -- after inserts the row again, waiting for this transaction's deletion to commit.
    tenants_left := prune.max_jobs;
    FOR r IN
        SELECT DISTINCT t.queue FROM pgq.tenants AS t
        WHERE t.weight = 1
          AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = t.queue AND j.tenant = t.tenant)
    LOOP
        EXIT WHEN tenants_left <= 0;
        CONTINUE WHEN NOT pg_try_advisory_lock(1885827329, hashtext(r.queue));
        BEGIN
            WITH gone AS (
                DELETE FROM pgq.tenants AS t
                WHERE (t.queue, t.tenant) IN (
                    SELECT x.queue, x.tenant FROM pgq.tenants AS x
                    WHERE x.queue = r.queue AND x.weight = 1
                      AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = x.queue AND j.tenant = x.tenant)
                    LIMIT tenants_left
                    FOR UPDATE SKIP LOCKED)
                RETURNING 1
            )
            SELECT tenants_left - count(*) INTO tenants_left FROM gone;
        EXCEPTION WHEN OTHERS THEN
            PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
            RAISE;
        END;
        PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
    END LOOP;
    -- And the per-key rate limits' buckets that are full again.
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(prune.max_jobs);
    END IF;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION pgq.prune(interval, integer) IS
    'Deletes up to max_jobs finished jobs (and their events) older than older_than or the queue''s retention.';

CREATE FUNCTION pgq.configure_queue(queue text, lease interval DEFAULT NULL,
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
                                    key_rate_limit integer DEFAULT NULL)
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
    IF configure_queue.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', configure_queue.lease, interval '1 day');
    END IF;
    IF configure_queue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', configure_queue.max_attempts));
    END IF;
    IF configure_queue.backoff_base IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_base', configure_queue.backoff_base, interval '365 days');
    END IF;
    IF configure_queue.backoff_cap IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_cap', configure_queue.backoff_cap, interval '365 days');
    END IF;
    IF coalesce(configure_queue.backoff_cap, q.backoff_cap)
       < coalesce(configure_queue.backoff_base, q.backoff_base) THEN
        PERFORM pgq._bad_argument('backoff_cap', 'must not be less than backoff_base');
    END IF;
    PERFORM pgq._check_span('retention', configure_queue.retention);
    IF configure_queue.retention < interval '0' OR configure_queue.retention > interval '3650 days' THEN
        PERFORM pgq._bad_argument('retention', 'must be between 0 and 3650 days');
    END IF;
    IF configure_queue.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no cap) and 100000, got %s', configure_queue.max_running));
    END IF;
    IF configure_queue.key_max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('key_max_running',
            format('must be between 0 (no limit) and 100000, got %s', configure_queue.key_max_running));
    END IF;
    PERFORM pgq._check_span('max_run_time', configure_queue.max_run_time);
    IF configure_queue.max_run_time < interval '0' OR configure_queue.max_run_time > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_run_time',
            format('must be between 0 (no limit) and 365 days, got %s', configure_queue.max_run_time));
    END IF;
    IF configure_queue.rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', configure_queue.rate_limit));
    END IF;
    IF configure_queue.rate_period IS NOT NULL THEN
        PERFORM pgq._check_interval('rate_period', configure_queue.rate_period, interval '1 day');
    END IF;
    IF configure_queue.key_rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('key_rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', configure_queue.key_rate_limit));
    END IF;
    IF configure_queue.fair AND NOT q.fair THEN
        -- Jobs already in the queue join fair mode: those without a tenant get the tenant '',
        -- and every tenant gets its row. (Switch a queue to fair mode before producers use it:
        -- an enqueue that read the queue's settings before this commits stores no tenant, and
        -- fair claims do not see such a job until it is given one.)
        UPDATE pgq.jobs AS j SET tenant = ''
        WHERE j.queue = configure_queue.queue AND j.tenant IS NULL AND j.state <> 'done';
        INSERT INTO pgq.tenants AS t (queue, tenant)
        SELECT DISTINCT j.queue, j.tenant FROM pgq.jobs AS j
        WHERE j.queue = configure_queue.queue AND j.tenant IS NOT NULL AND j.state <> 'done'
        ON CONFLICT DO NOTHING;
    END IF;
    -- A new rate or period keeps what the buckets handed out: their debt is rescaled to as many
    -- tokens of the new rate (pgq._rescaled_tat); a rate set to 0 forgets it. (Read after the
    -- queue's row lock, like a claim's.)
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
    UPDATE pgq.queues AS s
    SET lease = coalesce(configure_queue.lease, s.lease),
        max_attempts = coalesce(configure_queue.max_attempts, s.max_attempts),
        backoff_base = coalesce(configure_queue.backoff_base, s.backoff_base),
        backoff_cap = coalesce(configure_queue.backoff_cap, s.backoff_cap),
        retention = coalesce(configure_queue.retention, s.retention),
        notify = coalesce(configure_queue.notify, s.notify),
        audit = coalesce(configure_queue.audit, s.audit),
        fair = coalesce(configure_queue.fair, s.fair),
        max_running = coalesce(configure_queue.max_running, s.max_running),
        max_run_time = CASE WHEN configure_queue.max_run_time IS NULL THEN s.max_run_time
                            WHEN configure_queue.max_run_time = interval '0' THEN NULL
                            ELSE configure_queue.max_run_time END,
        key_max_running = coalesce(configure_queue.key_max_running, s.key_max_running),
        key_limited = coalesce(configure_queue.key_max_running, s.key_max_running) > 0
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = configure_queue.queue),
        rate_limit = new_rate,
        rate_period = new_period,
        key_rate_limit = new_key_rate,
        rate_limited = new_rate > 0 OR new_key_rate > 0,
        rate_tat = CASE WHEN new_rate = 0 THEN NULL
                        WHEN new_rate = s.rate_limit AND new_period = s.rate_period THEN s.rate_tat
                        ELSE pgq._rescaled_tat(s.rate_tat, s.rate_limit, s.rate_period, new_rate, new_period, rate_now)
                   END
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer) IS
    'Changes a queue''s settings (NULL leaves one unchanged; max_run_time ''0'' removes the limit) '
    'and returns them; creates the queue if new.';

-- Weights a tenant of a fair queue: it gets `weight` jobs started for every one of a weight-1
-- tenant's while both have work. Returns the tenant's row (created if new).
CREATE FUNCTION pgq.set_tenant_weight(queue text, tenant text, weight integer)
    RETURNS pgq.tenants
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
    result_row pgq.tenants;
BEGIN
    PERFORM pgq._check_name('queue', set_tenant_weight.queue);
    IF set_tenant_weight.tenant IS NULL THEN
        PERFORM pgq._bad_argument('tenant', 'must not be NULL', 'The jobs without a tenant are the tenant ''''.');
    ELSIF length(set_tenant_weight.tenant) > 256 THEN
        PERFORM pgq._bad_argument('tenant', 'must be at most 256 characters long');
    END IF;
    IF set_tenant_weight.weight IS NULL THEN
        PERFORM pgq._bad_argument('weight', 'must not be NULL');
    ELSIF set_tenant_weight.weight NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('weight', format('must be between 1 and 1000, got %s', set_tenant_weight.weight));
    END IF;
    q := pgq._queue(set_tenant_weight.queue);
    INSERT INTO pgq.tenants AS t (queue, tenant, weight)
    VALUES (set_tenant_weight.queue, set_tenant_weight.tenant, set_tenant_weight.weight)
    ON CONFLICT ON CONSTRAINT tenants_pkey DO UPDATE SET weight = excluded.weight
    RETURNING * INTO result_row;
    RETURN result_row;
END
$$;
COMMENT ON FUNCTION pgq.set_tenant_weight(text, text, integer) IS
    'Sets the weight (1 to 1000, default 1) of a tenant of a fair queue and returns its row.';

-- Overrides a queue's key_max_running for one concurrency key (max_running 0: no limit for this
-- key; NULL: the override is removed). Returns the limit now in effect for the key (0: none).
-- Under the queue row's lock, so that claims see the override and queues.key_limited together.
CREATE FUNCTION pgq.set_key_limit(queue text, key text, max_running integer)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    PERFORM pgq._check_name('queue', set_key_limit.queue);
    IF set_key_limit.key IS NULL THEN
        PERFORM pgq._bad_argument('key', 'must not be NULL');
    END IF;
    PERFORM pgq._check_concurrency_key('key', set_key_limit.key);
    IF set_key_limit.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no limit for this key) and 100000, or NULL (remove the override), got %s',
                   set_key_limit.max_running));
    END IF;
    q := pgq._queue(set_key_limit.queue);
    q := pgq._lock_queue(set_key_limit.queue);
    IF set_key_limit.max_running IS NULL THEN
        DELETE FROM pgq.key_limits AS l WHERE l.queue = set_key_limit.queue AND l.key = set_key_limit.key;
    ELSE
        INSERT INTO pgq.key_limits AS l (queue, key, max_running)
        VALUES (set_key_limit.queue, set_key_limit.key, set_key_limit.max_running)
        ON CONFLICT ON CONSTRAINT key_limits_pkey DO UPDATE SET max_running = excluded.max_running;
    END IF;
    UPDATE pgq.queues AS s
    SET key_limited = s.key_max_running > 0
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = set_key_limit.queue)
    WHERE s.name = set_key_limit.queue;
    RETURN coalesce(set_key_limit.max_running, q.key_max_running);
END
$$;
COMMENT ON FUNCTION pgq.set_key_limit(text, text, integer) IS
    'Overrides the queue''s key_max_running for one concurrency key (NULL removes the override); '
    'returns the limit now in effect for the key (0: none).';

-- Pausing or resuming a queue that does not exist is refused (22023): a typo creates nothing.
CREATE FUNCTION pgq.pause(queue text)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', pause.queue);
BEGIN
    PERFORM pgq._lock_queue(pause.queue);
    UPDATE pgq.queues AS s SET paused = true WHERE s.name = pause.queue RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.pause(text) IS
    'Stops claims from the queue (running jobs go on); enqueue still works. Returns its settings; '
    '22023 when there is no such queue.';

CREATE FUNCTION pgq.resume(queue text)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', resume.queue);
BEGIN
    PERFORM pgq._lock_queue(resume.queue);
    UPDATE pgq.queues AS s SET paused = false WHERE s.name = resume.queue RETURNING * INTO q;
    IF q.notify THEN
        PERFORM pg_notify('pgq', resume.queue);
    END IF;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.resume(text) IS 'Lets workers claim from the queue again. Returns its settings; 22023 when there is no such queue.';

-- Functions: per-queue grants ---------------------------------------------------------------------

-- Validates the arguments of pgq.grant_queue and pgq.revoke_queue (in this order: queue, role,
-- privilege) and locks the queue's row, so that the grants and revokes of one queue take turns;
-- returns the role's oid. For a revoke (dropped_ok), a role that no longer exists may be named by
-- the oid pgq.queue_grants lists for it.
CREATE FUNCTION pgq._grant_target(queue text, role text, privilege text, dropped_ok boolean)
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
    PERFORM pgq._lock_queue(_grant_target.queue);  -- at most lock_timeout (5 s), then 55P03
    RETURN role_oid;
END
$$;

-- Keeps queues.restricted equal to the privileges that have grants on the queue.
CREATE FUNCTION pgq._refresh_restricted(queue text) RETURNS text[]
    LANGUAGE sql
    AS $$
    UPDATE pgq.queues AS q
    SET restricted = (SELECT array_agg(DISTINCT g.privilege ORDER BY g.privilege) FROM pgq.grants AS g
                      WHERE g.queue = _refresh_restricted.queue)
    WHERE q.name = _refresh_restricted.queue
    RETURNING q.restricted
$$;

-- Lets the members of `role` use `privilege` (enqueue, claim or read) on an existing queue. The
-- queue's first grant of a privilege restricts that privilege to the granted roles (and
-- pgq_admin) from the grant's commit on. Returns true when the grant is new, false when it was
-- there already.
CREATE FUNCTION pgq.grant_queue(queue text, role text, privilege text)
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
CREATE FUNCTION pgq.revoke_queue(queue text, role text, privilege text)
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
CREATE FUNCTION pgq.queue_grants(queue text DEFAULT NULL)
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

-- Removes a queue that has nothing left in it: its settings row and its tenants. Refused with 55000
-- while the queue has jobs (of any state: cancel or finish the unfinished ones, pgq.prune the
-- finished ones) or schedules (pgq.unschedule them), and with 22023 when there is no such queue.
-- Race-free against enqueues: the queue's writer lock, taken exclusively and held to commit,
-- waits for the enqueues in flight (so their jobs are seen and refuse the drop), and an enqueue
-- that comes later waits for the drop, then creates the queue again with the defaults.
CREATE FUNCTION pgq.drop_queue(queue text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', drop_queue.queue);
BEGIN
    BEGIN
        PERFORM pg_advisory_xact_lock(1885827329, hashtext(drop_queue.queue));
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: queue % is being written to by another session; gave up after lock_timeout %',
            drop_queue.queue, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'A transaction that enqueued into it has not ended: end it, and try again.';
    END;
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
    DELETE FROM pgq.queues AS s WHERE s.name = drop_queue.queue;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.drop_queue(text) IS
    'Removes a queue without jobs or schedules (its settings and tenants); 55000 while it has any, '
    '22023 when there is no such queue.';

-- Functions: schedules ----------------------------------------------------------------------------

-- Creates or replaces the schedule `name`: exactly one of cron (pgq.cron_next's grammar, read in
-- `timezone`) or every (the instants 'epoch' + k * every: '1 hour' fires on the hour). Its first
-- occurrence is the first one after now (after its last run, when replaced). Returns its row.
CREATE FUNCTION pgq.schedule(name text, queue text, kind text, cron text DEFAULT NULL,
                             every interval DEFAULT NULL, payload jsonb DEFAULT '{}',
                             timezone text DEFAULT 'UTC', priority integer DEFAULT 0,
                             max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                             skip_if_running boolean DEFAULT false, enabled boolean DEFAULT true)
    RETURNS pgq.schedules
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    result_row pgq.schedules;
    old_queue  text;  -- the queue of the schedule this call replaces, if any
BEGIN
    PERFORM pgq._check_name('name', schedule.name);
    PERFORM pgq._check_enqueue(schedule.queue, schedule.kind, pgq._now(), schedule.priority,
                               schedule.max_attempts, schedule.tenant);
    PERFORM pgq._check_payload('payload', schedule.payload);
    IF schedule.cron IS NULL AND schedule.every IS NULL THEN
        PERFORM pgq._bad_argument('cron', 'or every must be given',
            'Pass exactly one: cron => ''0 * * * *'' or every => ''1 hour''.');
    ELSIF schedule.cron IS NOT NULL AND schedule.every IS NOT NULL THEN
        PERFORM pgq._bad_argument('every', 'must be NULL when cron is given',
            'Pass exactly one of cron and every.');
    ELSIF schedule.every IS NOT NULL
          AND (extract(year FROM schedule.every) <> 0 OR extract(month FROM schedule.every) <> 0) THEN
        PERFORM pgq._bad_argument('every', format('must not count months or years, got %s', schedule.every),
            'Months differ in length: use cron (''0 0 1 * *'' is the first of every month).');
    ELSIF NOT pgq._is_span(schedule.every) THEN
        PERFORM pgq._check_span('every', schedule.every);
    ELSIF schedule.every < interval '1 second' OR schedule.every > interval '3650 days' THEN
        PERFORM pgq._bad_argument('every',
            format('must be between 1 second and 3650 days, got %s', schedule.every));
    END IF;
    IF schedule.timezone IS NULL THEN
        PERFORM pgq._bad_argument('timezone', 'must not be NULL', 'Omit it for UTC.');
    END IF;
    BEGIN
        PERFORM pgq._now() AT TIME ZONE schedule.timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM pgq._bad_argument('timezone',
            format('is not a known time zone: %s', left(quote_literal(schedule.timezone), 80)),
            'Use a name from pg_timezone_names, such as ''Europe/Paris'' or ''UTC''.');
    END;
    IF schedule.skip_if_running IS NULL THEN
        PERFORM pgq._bad_argument('skip_if_running', 'must not be NULL');
    END IF;
    IF schedule.enabled IS NULL THEN
        PERFORM pgq._bad_argument('enabled', 'must not be NULL');
    END IF;
    -- A malformed cron expression raises here (pgq.cron_next), before anything is written.
    PERFORM pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now());

    PERFORM pgq._queue(schedule.queue);
    SELECT x.queue INTO old_queue FROM pgq.schedules AS x WHERE x.name = schedule.name;
    -- A replaced schedule's next run comes after its last one, whatever this statement's clock.
    INSERT INTO pgq.schedules AS x (name, queue, kind, cron, every, payload, timezone, priority,
                                    max_attempts, tenant, skip_if_running, enabled, next_run_at)
    VALUES (schedule.name, schedule.queue, schedule.kind, schedule.cron, schedule.every,
            schedule.payload, schedule.timezone, schedule.priority, schedule.max_attempts,
            schedule.tenant, schedule.skip_if_running, schedule.enabled,
            pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now()))
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
    SET queue = excluded.queue, kind = excluded.kind, cron = excluded.cron, every = excluded.every,
        payload = excluded.payload, timezone = excluded.timezone, priority = excluded.priority,
        max_attempts = excluded.max_attempts, tenant = excluded.tenant,
        skip_if_running = excluded.skip_if_running, enabled = excluded.enabled,
        next_run_at = pgq._next_fire(excluded.cron, excluded.every, excluded.timezone,
                                     greatest(pgq._now(), x.last_run_at, x.last_skipped_at))
    RETURNING * INTO result_row;
    PERFORM pgq._refresh_schedule_due(ARRAY[schedule.queue, old_queue], false);
    RETURN result_row;
END
$$;
COMMENT ON FUNCTION pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean) IS
    'Creates or replaces a periodic schedule (cron or every) and returns its row with next_run_at.';

CREATE FUNCTION pgq.unschedule(name text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    gone_queue text;
BEGIN
    IF unschedule.name IS NULL THEN
        PERFORM pgq._bad_argument('name', 'must not be NULL');
    END IF;
    DELETE FROM pgq.schedules AS x WHERE x.name = unschedule.name RETURNING x.queue INTO gone_queue;
    IF gone_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pgq._refresh_schedule_due(ARRAY[gone_queue], false);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.unschedule(text) IS
    'Deletes the schedule (its jobs stay); false when there was none of that name.';

CREATE FUNCTION pgq.schedules()
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

-- Functions: observe ------------------------------------------------------------------------------

CREATE FUNCTION pgq.stats()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, done bigint, failed bigint, cancelled bigint,
                   outcome_unknown bigint, oldest_ready_age interval, waiting bigint)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT q.name, q.paused,
           count(*) FILTER (WHERE j.state = 'pending' AND j.run_at <= pgq._now()),
           count(*) FILTER (WHERE j.state = 'pending' AND j.run_at > pgq._now()),
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'running' AND j.lease_until < pgq._now()),
           count(*) FILTER (WHERE j.state = 'done'),
           count(*) FILTER (WHERE j.state = 'failed'),
           count(*) FILTER (WHERE j.state = 'cancelled'),
           count(*) FILTER (WHERE j.state = 'outcome_unknown'),
           pgq._now() - min(j.run_at) FILTER (WHERE j.state = 'pending' AND j.run_at <= pgq._now()),
           count(*) FILTER (WHERE j.state = 'waiting')
    FROM pgq.queues AS q
    LEFT JOIN pgq.jobs AS j ON j.queue = q.name
    GROUP BY q.name, q.paused
    ORDER BY q.name
$$;
COMMENT ON FUNCTION pgq.stats() IS
    'One row per queue: jobs by state (pending = due now, scheduled = due later, waiting = for their '
    'dependencies), expired leases, and the age of the oldest due job.';

-- What an exporter scrapes, one row per queue, at a bounded cost: the claimable pending jobs
-- through jobs_ready_idx, outcome_unknown through jobs_list_idx, the running ones through
-- jobs_lease_idx (all of them: as many as the workers run), the finished counters from
-- pgq.finished_counts plus the deltas not folded yet (folded first, when it can). No finished row
-- of pgq.jobs is read.
CREATE FUNCTION pgq.metrics()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, outcome_unknown bigint, oldest_ready_age interval,
                   done_total bigint, failed_total bigint, cancelled_total bigint, waiting bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._fold_finished();
    RETURN QUERY
    WITH leased AS (
        SELECT j.queue, count(*) AS running, count(*) FILTER (WHERE j.lease_until < pgq._now()) AS expired
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL
        GROUP BY j.queue
    ), finished AS (
        SELECT f.queue,
               sum(f.n) FILTER (WHERE f.state = 'done') AS done,
               sum(f.n) FILTER (WHERE f.state = 'failed') AS failed,
               sum(f.n) FILTER (WHERE f.state = 'cancelled') AS cancelled
        FROM (SELECT c.queue, c.state, c.total AS n FROM pgq.finished_counts AS c
              UNION ALL
              SELECT d.queue, d.state, count(*) FROM pgq.finished_deltas AS d GROUP BY d.queue, d.state) AS f
        GROUP BY f.queue
    )
    SELECT q.name, q.paused, p.due, p.later, coalesce(l.running, 0), coalesce(l.expired, 0), u.n,
           pgq._now() - p.oldest,
           coalesce(f.done, 0)::bigint, coalesce(f.failed, 0)::bigint, coalesce(f.cancelled, 0)::bigint, w.n
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE j.run_at <= pgq._now()) AS due,
               count(*) FILTER (WHERE j.run_at > pgq._now()) AS later,
               min(j.run_at) FILTER (WHERE j.run_at <= pgq._now()) AS oldest
        FROM pgq.jobs AS j
        WHERE j.queue = q.name AND j.state = 'pending' AND j.attempt < j.max_attempts) AS p
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgq.jobs AS j WHERE j.queue = q.name AND j.state = 'outcome_unknown') AS u
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgq.jobs AS j WHERE j.queue = q.name AND j.state = 'waiting') AS w
    LEFT JOIN leased AS l ON l.queue = q.name
    LEFT JOIN finished AS f ON f.queue = q.name
    ORDER BY q.name;
END
$$;
COMMENT ON FUNCTION pgq.metrics() IS
    'One row per queue for exporters, without reading finished jobs: pending (due now) and scheduled '
    'jobs, running, expired leases, outcome_unknown, the oldest due job''s age, the jobs finished '
    'as done, failed and cancelled (counters, from the finished rows stored at migration 0010 on: '
    'pgq.prune does not lower them), and the jobs waiting for their dependencies.';

-- Health: one row per finding, for dashboards, alerts and readiness probes (pgq-thin doctor).
-- severity: ok, warning or critical. The thresholds are arguments so operators (and tests) can
-- tighten them. Session checks read pg_stat_activity: the schema owner needs the pg_monitor role
-- (or to be a superuser) to see other roles' sessions.
CREATE FUNCTION pgq.health(max_snapshot_age interval DEFAULT '5 minutes',
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
CREATE FUNCTION pgq.get_job(id bigint)
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
CREATE FUNCTION pgq.job_history(id bigint)
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
CREATE FUNCTION pgq.list_jobs(queue text DEFAULT NULL, state text DEFAULT NULL, kind text DEFAULT NULL,
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

-- For a worker at start: whether each of its queues exists and is paused (a worker may not read
-- pgq.stats).
CREATE FUNCTION pgq.queue_status(queues text[])
    RETURNS TABLE (queue text, known boolean, paused boolean)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT n.name, q.name IS NOT NULL, coalesce(q.paused, false)
    FROM unnest(queue_status.queues) WITH ORDINALITY AS n(name, i)
    LEFT JOIN pgq.queues AS q ON q.name = n.name
    ORDER BY n.i
$$;
COMMENT ON FUNCTION pgq.queue_status(text[]) IS
    'For each named queue, in order: whether it exists and whether it is paused.';

-- Every queue's settings (or one queue's: 22023 when there is no such queue), for dashboards and
-- operators: what pgq.configure_queue set, whether it is paused, and which privileges have
-- per-queue grants (restricted). A row of pgq.queues, so a setting a later migration adds is in
-- it too.
CREATE FUNCTION pgq.queue_settings(queue text DEFAULT NULL)
    RETURNS SETOF pgq.queues
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT pgq._existing_queue('queue', queue_settings.queue) WHERE queue_settings.queue IS NOT NULL;
    SELECT q.* FROM pgq.queues AS q
    WHERE queue_settings.queue IS NULL OR q.name = queue_settings.queue
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.queue_settings(text) IS
    'The settings of every queue (or of one): a row of pgq.queues each, by name.';

-- Every queue with a limit (max_running, key limits or rate limits; or the named one, 22023 when
-- there is no such queue): its due jobs, its running ones, its limits, and how many of the due
-- jobs each limit holds back now, so that a rate-limited queue can be told from one without
-- workers. Each held_by_* counts the due jobs that limit alone holds back (a job may be held by
-- several): beyond the queue's free places (max_running), beyond their key's free places (key
-- limits), beyond the tokens the queue's bucket holds now (rate_limit), beyond their key's tokens
-- (key_rate_limit). next_token_at: when the queue's bucket holds a token again (NULL: it holds
-- one, or has no rate limit); next_key_token_at: the earliest such moment of a key with held
-- jobs. Its cost: each listed queue's due jobs (jobs_ready_idx) and running jobs (jobs_lease_idx)
-- are read once, and its keys' rows; no finished job is read.
CREATE FUNCTION pgq.queue_limits(queue text DEFAULT NULL)
    RETURNS TABLE (queue text, paused boolean, ready bigint, running bigint, max_running integer,
                   key_max_running integer, rate_limit integer, rate_period interval,
                   key_rate_limit integer, held_by_max_running bigint, held_by_key_limit bigint,
                   held_by_rate_limit bigint, held_by_key_rate_limit bigint,
                   next_token_at timestamptz, next_key_token_at timestamptz)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
    SELECT pgq._existing_queue('queue', queue_limits.queue) WHERE queue_limits.queue IS NOT NULL;
    WITH clock AS MATERIALIZED (
        SELECT pgq._rate_clock() AS at
    ), listed AS MATERIALIZED (
        SELECT q.* FROM pgq.queues AS q
        WHERE CASE WHEN queue_limits.queue IS NULL THEN q.max_running > 0 OR q.key_limited OR q.rate_limited
                   ELSE q.name = queue_limits.queue END
    ), due AS (
        SELECT j.queue, j.concurrency_key AS key, count(*) AS n
        FROM listed AS q
        JOIN pgq.jobs AS j ON j.queue = q.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                          AND j.run_at <= pgq._now()
        GROUP BY j.queue, j.concurrency_key
    ), leased AS (
        SELECT j.queue, j.concurrency_key AS key, count(*) AS n
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL AND j.queue IN (SELECT l.name FROM listed AS l)
        GROUP BY j.queue, j.concurrency_key
    ), keys AS (
        SELECT d.queue,
               sum(greatest(d.n - greatest(coalesce(l.max_running, q.key_max_running) - coalesce(r.n, 0), 0), 0))
                   FILTER (WHERE coalesce(l.max_running, q.key_max_running) > 0) AS held_by_key_limit,
               sum(greatest(d.n - pgq._tokens(k.tat, q.key_rate_limit, q.rate_period, c.at), 0))
                   FILTER (WHERE q.key_rate_limit > 0) AS held_by_key_rate_limit,
               min(pgq._next_token_at(k.tat, q.key_rate_limit, q.rate_period, c.at)) AS next_key_token_at
        FROM due AS d
        JOIN listed AS q ON q.name = d.queue
        CROSS JOIN clock AS c
        LEFT JOIN pgq.key_limits AS l ON l.queue = d.queue AND l.key = d.key
        LEFT JOIN leased AS r ON r.queue = d.queue AND r.key = d.key
        LEFT JOIN pgq.key_rates AS k ON k.queue = d.queue AND k.key = d.key
        WHERE d.key IS NOT NULL AND (q.key_limited OR q.key_rate_limit > 0)
        GROUP BY d.queue
    ), totals AS (
        SELECT q.name,
               coalesce((SELECT sum(d.n) FROM due AS d WHERE d.queue = q.name), 0)::bigint AS ready,
               coalesce((SELECT sum(r.n) FROM leased AS r WHERE r.queue = q.name), 0)::bigint AS running
        FROM listed AS q
    )
    SELECT q.name, q.paused, t.ready, t.running, q.max_running, q.key_max_running, q.rate_limit,
           q.rate_period, q.key_rate_limit,
           CASE WHEN q.max_running > 0 THEN greatest(t.ready - greatest(q.max_running - t.running, 0), 0) ELSE 0 END,
           coalesce(k.held_by_key_limit, 0)::bigint,
           CASE WHEN q.rate_limit > 0
                THEN greatest(t.ready - pgq._tokens(q.rate_tat, q.rate_limit, q.rate_period, c.at), 0) ELSE 0 END,
           coalesce(k.held_by_key_rate_limit, 0)::bigint,
           pgq._next_token_at(q.rate_tat, q.rate_limit, q.rate_period, c.at),
           CASE WHEN k.held_by_key_rate_limit > 0 THEN k.next_key_token_at END
    FROM listed AS q
    CROSS JOIN clock AS c
    JOIN totals AS t ON t.name = q.name
    LEFT JOIN keys AS k ON k.queue = q.name
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.queue_limits(text) IS
    'Every queue with a limit (or one): due and running jobs, its limits, how many due jobs each '
    'limit holds back now (held_by_*), and when its next token is due.';

-- For a worker after a claim that came back short: each rate-limited queue of `queues` (NULL:
-- every one), with how long until a claim may get a job its rate limits hold back now: 0 while
-- its bucket holds a token and none of its keys is out of tokens; otherwise until the queue's
-- next token, or the earliest next token of a key out of tokens (whether or not that key has due
-- jobs: an index range, never a read of the jobs). A worker calls it only for queues it knows are
-- rate-limited (this function's last answer), so other queues pay nothing.
CREATE FUNCTION pgq.rate_limit_wait(queues text[] DEFAULT NULL)
    RETURNS TABLE (queue text, wait interval)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
    SELECT q.name,
           greatest(coalesce(pgq._next_token_at(q.rate_tat, q.rate_limit, q.rate_period, c.at),
                             (SELECT min(pgq._next_token_at(k.tat, q.key_rate_limit, q.rate_period, c.at))
                              FROM pgq.key_rates AS k
                              WHERE q.key_rate_limit > 0 AND k.queue = q.name
                                AND k.tat > c.at + q.rate_period - q.rate_period / nullif(q.key_rate_limit, 0)
                                            - interval '1 microsecond'),
                             c.at) - c.at, interval '0')
    FROM pgq.queues AS q
    CROSS JOIN (SELECT pgq._rate_clock() AS at) AS c
    WHERE q.rate_limited AND NOT q.paused
      AND (rate_limit_wait.queues IS NULL OR q.name = ANY (rate_limit_wait.queues))
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.rate_limit_wait(text[]) IS
    'Each rate-limited queue of queues (NULL: all) and how long until its rate limits let a claim '
    'take a job they hold back now (0: they hold none back).';

-- The schema version: the number of the newest migration. Every migration redefines it (and
-- tests/test_schema_matches_migrations.py checks that it names the newest migration file).
CREATE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '13'::text $$;
COMMENT ON FUNCTION pgq.version() IS
    'The version of the installed pgq schema: the number of the newest migration applied.';

-- Grants -----------------------------------------------------------------------------------------
-- Nobody but the owner touches the tables: every role works through the functions.

REVOKE ALL ON ALL TABLES IN SCHEMA pgq FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgq FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC;
REVOKE ALL ON SCHEMA pgq FROM PUBLIC;

GRANT USAGE ON SCHEMA pgq TO pgq_producer, pgq_worker, pgq_admin, pgq_monitor;

GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[]),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[])
    TO pgq_producer;

GRANT EXECUTE ON FUNCTION
    pgq.claim(text, text[], integer, interval, text[]),
    pgq.queue_status(text[]),
    pgq.renew(bigint, integer, interval),
    pgq.complete(bigint, integer, jsonb),
    pgq.complete_many(bigint[], integer[]),
    pgq.fail(bigint, integer, text, interval, boolean),
    pgq.release(bigint, integer),
    pgq.snooze(bigint, integer, interval),
    pgq.mark_unknown(bigint, integer, text),
    pgq.progress(bigint, integer, jsonb),
    pgq.sweep(integer),
    pgq.rate_limit_wait(text[])
    TO pgq_worker;

GRANT EXECUTE ON FUNCTION
    pgq.cancel(bigint),
    pgq.retry(bigint),
    pgq.resolve(bigint, text),
    pgq.prune(interval, integer),
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer),
    pgq.set_tenant_weight(text, text, integer),
    pgq.set_key_limit(text, text, integer),
    pgq.pause(text),
    pgq.resume(text),
    pgq.drop_queue(text),
    pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean),
    pgq.unschedule(text),
    pgq.grant_queue(text, text, text),
    pgq.revoke_queue(text, text, text)
    TO pgq_admin;

GRANT EXECUTE ON FUNCTION
    pgq.stats(),
    pgq.health(interval, interval),
    pgq.get_job(bigint),
    pgq.job_history(bigint),
    pgq.list_jobs(text, text, text, integer, bigint),
    pgq.queue_status(text[]),
    pgq.schedules(),
    pgq.queue_grants(text),
    pgq.metrics(),
    pgq.queue_settings(text),
    pgq.queue_limits(text),
    pgq.rate_limit_wait(text[]),
    pgq.version()
    TO pgq_monitor;

GRANT EXECUTE ON FUNCTION pgq.version() TO pgq_producer, pgq_worker;
-- A pure function: every pgq role may compute a schedule's next firing.
GRANT EXECUTE ON FUNCTION pgq.cron_next(text, timestamptz, text)
    TO pgq_producer, pgq_worker, pgq_admin, pgq_monitor;
