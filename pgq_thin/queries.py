"""Every statement pgq_thin sends, in one place: the client's and the worker's each call exactly one
pgq function, with named arguments and explicit casts. Nothing here decides queue state; the
functions do. The sections at the end hold the few statements that are not a pgq function's call:
the catalog questions of the CLI and the dashboard, the database clock, LISTEN, and the test kit's
(the drain's view of the tables, the throwaway servers' databases, the replication topologies).
The development tools (tools/pgq_tools/) and the migrations runner keep their own SQL."""

from __future__ import annotations

# Producers ---------------------------------------------------------------------------------------

#: Add one job; returns its id (or, for a unique_key a live job holds, that job's id: kept as it is,
#: or with on_conflict 'replace' updated when it has not started).
ENQUEUE = (
    "SELECT pgq.enqueue(queue => %(queue)s::text, kind => %(kind)s::text,"
    " payload => %(payload)s::jsonb, run_at => coalesce(%(run_at)s::timestamptz, now()),"
    " priority => %(priority)s::integer, max_attempts => %(max_attempts)s::integer,"
    " unique_key => %(unique_key)s::text, tenant => %(tenant)s::text,"
    " max_run_time => %(max_run_time)s::interval, meta => %(meta)s::jsonb,"
    " concurrency_key => %(concurrency_key)s::text, depends_on => %(depends_on)s::bigint[],"
    " dependency_mode => %(dependency_mode)s::text, batch => %(batch)s::bigint,"
    " notify_finished => %(notify_finished)s::boolean, on_conflict => %(on_conflict)s::text,"
    " start_by => %(start_by)s::timestamptz, max_lifetime => %(max_lifetime)s::interval,"
    " tags => %(tags)s::text[], unique_for => %(unique_for)s::interval)"
)

#: Add one job per payload in one INSERT; returns the ids in payload order. The payloads go in
#: binary format (%b): the text form of a jsonb[] quotes every document, which cost about as much
#: as the INSERT itself for 1000 payloads.
ENQUEUE_MANY = (
    "SELECT id FROM pgq.enqueue_many(queue => %(queue)s::text, kind => %(kind)s::text,"
    " payloads => %(payloads)b::jsonb[], run_at => coalesce(%(run_at)s::timestamptz, now()),"
    " priority => %(priority)s::integer, max_attempts => %(max_attempts)s::integer,"
    " tenant => %(tenant)s::text, max_run_time => %(max_run_time)s::interval,"
    " meta => %(meta)s::jsonb,"
    " concurrency_key => %(concurrency_key)s::text, depends_on => %(depends_on)s::bigint[],"
    " dependency_mode => %(dependency_mode)s::text, batch => %(batch)s::bigint,"
    " notify_finished => %(notify_finished)s::boolean, unique_keys => %(unique_keys)s::text[],"
    " on_conflict => %(on_conflict)s::text, tags => %(tags)s::text[],"
    " unique_for => %(unique_for)s::interval) AS t(id)"
)

# Batches and results -----------------------------------------------------------------------------

#: Open a batch: its callback is enqueued once it is sealed and its members have ended.
BATCH_OPEN = (
    "SELECT pgq.batch_open(callback_queue => %(callback_queue)s::text, callback_kind => %(callback_kind)s::text,"
    " callback_payload => %(callback_payload)s::jsonb, run_when => %(run_when)s::text,"
    " joiners => %(joiners)s::text[])"
)
#: Seal a batch: true when sealed by this call, false when it already was.
BATCH_CLOSE = "SELECT pgq.batch_close(id => %(batch_id)s::bigint)"
BATCH_STATUS = "SELECT * FROM pgq.batch_status(id => %(batch_id)s::bigint)"
BATCH_JOBS = ("SELECT * FROM pgq.batch_jobs(id => %(batch_id)s::bigint, state => %(state)s::text,"
              " limit_rows => %(limit_rows)s::integer, before_id => %(before_id)s::bigint)")
#: Cancel a batch: its members that have not started (up to 1000 now; the sweep the rest) and its callback.
CANCEL_BATCH = "SELECT pgq.cancel_batch(id => %(batch_id)s::bigint)"
#: A job's state and, once it has ended, its result, last error and end (to its producer too).
JOB_RESULT = "SELECT state, result, last_error, finished_at FROM pgq.job_result(id => %(id)s::bigint)"
#: A page of the dependencies of our attempt's job and how each ended, by dependency id.
DEPENDENCY_RESULTS = (
    "SELECT dependency_id, state, result, last_error, finished_at"
    " FROM pgq.dependency_results(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " limit_rows => %(limit_rows)s::integer, after_id => %(after_id)s::bigint)"
)
#: A job's dependencies, then its dependants.
JOB_LINKS = ("SELECT relation, job_id, queue, kind, state"
             " FROM pgq.job_links(id => %(id)s::bigint, limit_rows => %(limit_rows)s::integer)")

# Workers -----------------------------------------------------------------------------------------

#: Claim up to batch due jobs (of kinds, when given); each row carries its fencing token (attempt).
CLAIM = (
    "SELECT id, queue, kind, payload, priority, attempt, max_attempts, run_at, created_at,"
    " lease_until, tenant, progress, deadline, meta"
    " FROM pgq.claim(worker => %(worker)s::text, queues => %(queues)s::text[],"
    " batch => %(batch)s::integer, lease => %(lease)s::interval, kinds => %(kinds)s::text[])"
)

#: Whether each of a worker's queues exists and is paused.
QUEUE_STATUS = "SELECT queue, known, paused FROM pgq.queue_status(queues => %(queues)s::text[])"
WORKER_HEARTBEAT = ("SELECT pgq.worker_heartbeat(worker => %(worker)s::text, queues => %(queues)s::text[],"
                    " kinds => %(kinds)s::text[], running => %(running)s::integer, host => %(host)s::text,"
                    " pid => %(pid)s::integer, alive_for => %(alive_for)s::interval,"
                    " stopping => %(stopping)s::boolean)")
WORKERS = ("SELECT worker, login, host, pid, queues, kinds, running, started_at, last_seen, alive_until"
           " FROM pgq.workers()")
QUEUE_KINDS = "SELECT queue, kind, handled FROM pgq.queue_kinds(queues => %(queues)s::text[])"
RATE_LIMIT_WAIT = "SELECT queue, wait FROM pgq.rate_limit_wait(queues => %(queues)s::text[])"

#: Extend the lease of our attempt; NULL when the job is no longer ours.
RENEW = "SELECT pgq.renew(id => %(id)s::bigint, attempt => %(attempt)s::integer, lease => %(lease)s::interval)"

#: Finish our attempt; false when the job is no longer ours.
COMPLETE = "SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer, result => %(result)s::jsonb)"

#: Finish several attempts; returns the ids completed.
COMPLETE_MANY = (
    "SELECT id FROM pgq.complete_many(ids => %(ids)s::bigint[], attempts => %(attempts)s::integer[]) AS t(id)"
)

#: Complete several attempts and claim the next jobs in one transaction: each row is the ids
#: completed, then a claimed job's fields in CLAIM's order (NULL when none was claimed).
COMPLETE_AND_CLAIM = (
    "SELECT completed, id, queue, kind, payload, priority, attempt, max_attempts, run_at, created_at,"
    " lease_until, tenant, progress, deadline, meta"
    " FROM pgq.complete_and_claim(ids => %(ids)s::bigint[], attempts => %(attempts)s::integer[],"
    " worker => %(worker)s::text, queues => %(queues)s::text[], batch => %(batch)s::integer,"
    " lease => %(lease)s::interval, kinds => %(kinds)s::text[])"
)

#: Record a failed attempt; returns the new state, NULL when the job is no longer ours.
FAIL = (
    "SELECT pgq.fail(id => %(id)s::bigint, attempt => %(attempt)s::integer, error => %(error)s::text,"
    " retry_in => %(retry_in)s::interval, retryable => %(retryable)s::boolean)"
)

#: Give back an unstarted job without using up an attempt.
RELEASE = "SELECT pgq.release(id => %(id)s::bigint, attempt => %(attempt)s::integer)"

#: Pending again after delay, without using up an attempt; returns the new run_at.
SNOOZE = "SELECT pgq.snooze(id => %(id)s::bigint, attempt => %(attempt)s::integer, delay => %(delay)s::interval)"

#: Park our attempt as outcome_unknown.
MARK_UNKNOWN = "SELECT pgq.mark_unknown(id => %(id)s::bigint, attempt => %(attempt)s::integer, note => %(note)s::text)"

#: Store our attempt's checkpoint (kept across retries); false when the job is no longer ours.
PROGRESS = "SELECT pgq.progress(id => %(id)s::bigint, attempt => %(attempt)s::integer, progress => %(progress)s::jsonb)"

#: Recover running jobs whose lease expired or whose attempt timed out (returns how many), and
#: fire due schedules.
SWEEP = "SELECT pgq.sweep(max_jobs => %(max_jobs)s::integer)"

#: Settle what overlapped enqueues and ends left (release their dependants once both committed)
#: and move up to max_jobs dependants of the backlog on, fairly among logins, never waiting; how
#: many it moved on. A worker sends it every poll.
SETTLE_DEPENDENCIES = "SELECT pgq.settle_dependencies(max_jobs => %(max_jobs)s::integer)"

# Durable execution -------------------------------------------------------------------------------

#: A step's recorded result for our attempt: (found, result); no row when the attempt is not ours.
GET_STEP = (
    "SELECT found, result FROM pgq.get_step(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " name => %(name)s::text)"
)
#: A page of the recorded steps of our attempt's job, by name (no row when the attempt is not ours).
GET_STEPS = (
    "SELECT name, result FROM pgq.get_steps(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " after_name => %(after_name)s::text, limit_rows => %(limit_rows)s::integer)"
)
#: Record a step of our attempt (the first record of a name wins): false when the attempt is not ours.
RECORD_STEP = (
    "SELECT pgq.record_step(id => %(id)s::bigint, attempt => %(attempt)s::integer, name => %(name)s::text,"
    " result => %(result)s::jsonb)"
)
#: A durable sleep: ('sleeping', wake time) when our attempt ended until then, ('awake', wake time).
SLEEP = (
    "SELECT status, wake_at FROM pgq.sleep(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " name => %(name)s::text, delay => %(delay)s::interval)"
)
#: Wait for a signal of our job's queue: (arrived, payload), (timed_out), or (waiting): parked.
AWAIT_SIGNAL = (
    "SELECT status, payload FROM pgq.await_signal(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " name => %(name)s::text, timeout => %(timeout)s::interval)"
)
#: Enqueue a child of our attempt's job once per name; its id (NULL when the attempt is not ours).
SPAWN = (
    "SELECT pgq.spawn(id => %(id)s::bigint, attempt => %(attempt)s::integer, name => %(name)s::text,"
    " queue => %(queue)s::text, kind => %(kind)s::text, payload => %(payload)s::jsonb)"
)
#: Wait for jobs: 'ended', or 'waiting' with our job parked until they have (NULL: not ours).
AWAIT_JOBS = (
    "SELECT pgq.await_jobs(id => %(id)s::bigint, attempt => %(attempt)s::integer, ids => %(ids)s::bigint[])"
)
#: How the jobs our attempt's job awaited ended, by id.
JOB_OUTCOMES = (
    "SELECT job_id, state, result, last_error, finished_at FROM pgq.job_outcomes(id => %(id)s::bigint,"
    " attempt => %(attempt)s::integer, ids => %(ids)s::bigint[])"
)

#: Give a job not started a new payload, priority, run_at or meta (NULL: its own); whether it did.
UPDATE_JOB = (
    "SELECT pgq.update_job(id => %(id)s::bigint, payload => %(payload)s::jsonb, priority => %(priority)s::integer,"
    " run_at => %(run_at)s::timestamptz, meta => %(meta)s::jsonb)"
)

# Signals and workflows, for producers --------------------------------------------------------------

#: Send a signal to a queue (the first of a name wins); how many waiting jobs it woke.
SIGNAL = "SELECT pgq.signal(queue => %(queue)s::text, name => %(name)s::text, payload => %(payload)s::jsonb)"
#: A job's recorded steps, by name (for whoever may read its result).
JOB_STEPS = (
    "SELECT name, attempt, result, recorded_at FROM pgq.job_steps(id => %(id)s::bigint,"
    " limit_rows => %(limit_rows)s::integer, after_name => %(after_name)s::text)"
)
#: Cancel the unfinished jobs of a job's workflow (at most 10000 per call); how many.
CANCEL_WORKFLOW = "SELECT pgq.cancel_workflow(id => %(id)s::bigint)"

# Admin -------------------------------------------------------------------------------------------

CANCEL = "SELECT pgq.cancel(id => %(id)s::bigint)"
RETRY = "SELECT pgq.retry(id => %(id)s::bigint)"
#: Make at most limit_rows failed or cancelled jobs of a queue pending again (id order); how many.
RETRY_JOBS = (
    "SELECT pgq.retry_jobs(queue => %(queue)s::text, state => %(state)s::text, kind => %(kind)s::text,"
    " finished_before => %(finished_before)s::timestamptz, limit_rows => %(limit_rows)s::integer,"
    " tags => %(tags)s::text[])"
)
#: Cancel at most limit_rows unfinished jobs of a queue in one state (id order); how many.
CANCEL_JOBS = (
    "SELECT pgq.cancel_jobs(queue => %(queue)s::text, state => %(state)s::text, kind => %(kind)s::text,"
    " created_before => %(created_before)s::timestamptz, limit_rows => %(limit_rows)s::integer,"
    " tags => %(tags)s::text[])"
)
#: Delete at most limit_rows jobs of a queue in one state, never running (id order); how many.
DELETE_JOBS = (
    "SELECT pgq.delete_jobs(queue => %(queue)s::text, state => %(state)s::text, kind => %(kind)s::text,"
    " before => %(before)s::timestamptz, limit_rows => %(limit_rows)s::integer, tags => %(tags)s::text[])"
)
RESOLVE = "SELECT pgq.resolve(id => %(id)s::bigint, state => %(state)s::text)"
PRUNE = "SELECT pgq.prune(older_than => %(older_than)s::interval, max_jobs => %(max_jobs)s::integer)"
PAUSE = "SELECT * FROM pgq.pause(queue => %(queue)s::text, kind => %(kind)s::text)"
DROP_QUEUE = "SELECT pgq.drop_queue(queue => %(queue)s::text)"
RESUME = "SELECT * FROM pgq.resume(queue => %(queue)s::text, kind => %(kind)s::text)"
CONFIGURE_QUEUE = (
    "SELECT * FROM pgq.configure_queue(queue => %(queue)s::text, lease => %(lease)s::interval,"
    " max_attempts => %(max_attempts)s::integer, backoff_base => %(backoff_base)s::interval,"
    " backoff_cap => %(backoff_cap)s::interval, retention => %(retention)s::interval,"
    " notify => %(notify)s::boolean, audit => %(audit)s::boolean, fair => %(fair)s::boolean,"
    " max_running => %(max_running)s::integer, max_run_time => %(max_run_time)s::interval,"
    " key_max_running => %(key_max_running)s::integer, rate_limit => %(rate_limit)s::integer,"
    " rate_period => %(rate_period)s::interval, key_rate_limit => %(key_rate_limit)s::integer,"
    " retention_failed => %(retention_failed)s::interval, retention_cancelled => %(retention_cancelled)s::interval,"
    " keep_done => %(keep_done)s::boolean, max_wait => %(max_wait)s::interval,"
    " key_sequence => %(key_sequence)s::text, archive => %(archive)s::boolean)"
)
SET_TENANT_WEIGHT = (
    "SELECT * FROM pgq.set_tenant_weight(queue => %(queue)s::text, tenant => %(tenant)s::text,"
    " weight => %(weight)s::integer)"
)
SET_KEY_LIMIT = (
    "SELECT pgq.set_key_limit(queue => %(queue)s::text, key => %(key)s::text,"
    " max_running => %(max_running)s::integer)"
)

# Schedules ---------------------------------------------------------------------------------------

SCHEDULE = (
    "SELECT * FROM pgq.schedule(name => %(name)s::text, queue => %(queue)s::text, kind => %(kind)s::text,"
    " cron => %(cron)s::text, every => %(every)s::interval, payload => %(payload)s::jsonb,"
    " timezone => %(timezone)s::text, priority => %(priority)s::integer,"
    " max_attempts => %(max_attempts)s::integer, tenant => %(tenant)s::text,"
    " skip_if_running => %(skip_if_running)s::boolean, enabled => %(enabled)s::boolean)"
)
UNSCHEDULE = "SELECT pgq.unschedule(name => %(name)s::text)"
SCHEDULES = "SELECT * FROM pgq.schedules()"
GRANT_QUEUE = ("SELECT pgq.grant_queue(queue => %(queue)s::text, role => %(role)s::text,"
               " privilege => %(privilege)s::text)")
REVOKE_QUEUE = ("SELECT pgq.revoke_queue(queue => %(queue)s::text, role => %(role)s::text,"
                " privilege => %(privilege)s::text)")
QUEUE_GRANTS = "SELECT * FROM pgq.queue_grants(queue => %(queue)s::text)"
QUEUE_SETTINGS = "SELECT * FROM pgq.queue_settings(queue => %(queue)s::text)"

# Observe -----------------------------------------------------------------------------------------

STATS = "SELECT * FROM pgq.stats()"
QUEUE_LIMITS = "SELECT * FROM pgq.queue_limits(queue => %(queue)s::text)"
METRICS = "SELECT * FROM pgq.metrics()"
HEALTH = (
    "SELECT * FROM pgq.health(max_snapshot_age => %(max_snapshot_age)s::interval,"
    " max_ready_age => %(max_ready_age)s::interval)"
)
LIST_JOBS = (
    "SELECT * FROM pgq.list_jobs(queue => %(queue)s::text, state => %(state)s::text, kind => %(kind)s::text,"
    " limit_rows => %(limit_rows)s::integer, before_id => %(before_id)s::bigint, tags => %(tags)s::text[])"
)
GET_JOB = "SELECT * FROM pgq.get_job(id => %(id)s::bigint)"
JOB_HISTORY = "SELECT * FROM pgq.job_history(id => %(id)s::bigint)"
VERSION = "SELECT pgq.version()"

# Around the functions: the catalog, the clock, LISTEN ---------------------------------------------

#: The channel pgq's functions NOTIFY when a job becomes due (payload: the queue's name).
CHANNEL = "pgq"
LISTEN = f"LISTEN {CHANNEL}"

#: The channel pgq.cancel notifies when it cancels a running job (payload: '<id>:<attempt>', the
#: attempt cancelled): the worker that runs that attempt stops its handler at once.
CANCEL_CHANNEL = "pgq_cancel"
LISTEN_CANCEL = f"LISTEN {CANCEL_CHANNEL}"

#: The channel pgq notifies when a job enqueued with notify_finished ends (payload: the job's id):
#: Client.wait listens on it, on a connection of its own.
FINISHED_CHANNEL = "pgq_finished"
LISTEN_FINISHED = f"LISTEN {FINISHED_CHANNEL}"

#: The database's clock now (not the transaction's start): lease deadlines are on this clock.
CLOCK = "SELECT clock_timestamp()"

#: Whether the schema pgq is missing (the CLI's check before it makes a pool).
SCHEMA_MISSING = "SELECT to_regnamespace('pgq') IS NULL"
#: Whether pgq.metrics() is missing (a schema older than migration 0010).
METRICS_MISSING = "SELECT to_regprocedure('pgq.metrics()') IS NULL"
#: Whether the transaction has written nothing so far (no transaction id assigned): after
#: pgq.enqueue with a unique key, true when the key's live job was answered and nothing added.
WROTE_NOTHING = "SELECT pg_current_xact_id_if_assigned() IS NULL"

#: pgq's admin functions a login may or may not call (Client.privileges; the dashboard's buttons),
#: by the name of the client method that calls each, for the catalog question whether it may.
ACTION_FUNCTIONS = {
    "retry": "pgq.retry(bigint)",
    "cancel": "pgq.cancel(bigint)",
    "resolve": "pgq.resolve(bigint,text)",
    "pause": "pgq.pause(text,text)",
    "resume": "pgq.resume(text,text)",
    "retry_jobs": "pgq.retry_jobs(text,text,text,timestamptz,integer,text[])",
    "cancel_jobs": "pgq.cancel_jobs(text,text,text,timestamptz,integer,text[])",
    "delete_jobs": "pgq.delete_jobs(text,text,text,timestamptz,integer,text[])",
}
#: current_user and, per function (a column named after it), whether the login may call it: NULL
#: when the function does not exist (a schema older than the migration that adds it).
PRIVILEGES = ("SELECT current_user, " + ", ".join(
    f"has_function_privilege(to_regprocedure('{signature}'), 'EXECUTE') AS {action}"
    for action, signature in ACTION_FUNCTIONS.items()))

#: The metrics' health findings, counted by check and severity.
HEALTH_FINDINGS = 'SELECT "check", severity, count(*) FROM pgq.health() GROUP BY 1, 2 ORDER BY 1, 2'
#: What each limit holds back per queue (the columns in pgq_thin.metrics.LIMITS' order).
LIMITS_HELD_BACK = ("SELECT queue, held_by_max_running, held_by_key_limit, held_by_rate_limit,"
                    " held_by_key_rate_limit FROM pgq.queue_limits()")

# The test kit: the drain's view of the tables ---------------------------------------------------------

#: Per queue of the worker's (all when NULL): its due jobs of the worker's kinds in an unpaused
#: queue (the jobs the worker would claim: it claims only the kinds it has handlers for), and its
#: running jobs.
DRAIN_BUSY = """
    SELECT q.name,
           count(*) FILTER (WHERE j.state = 'pending' AND j.run_at <= now() AND NOT q.paused
                              AND j.kind = ANY (%(kinds)s::text[])),
           count(*) FILTER (WHERE j.state = 'running')
    FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name
    WHERE (%(queues)s::text[] IS NULL OR q.name = ANY (%(queues)s::text[])) AND j.state IN ('pending', 'running')
    GROUP BY q.name ORDER BY q.name"""
#: The jobs a drained worker claimed since the drain began.
DRAIN_CLAIMED = ("SELECT id FROM pgq.jobs WHERE claimed_by = %(worker)s::text AND claimed_at >= %(since)s::timestamptz"
                 " ORDER BY id")

# The test kit: throwaway servers' databases and replication topologies --------------------------------
# (psycopg.sql templates where a name is an identifier or a literal: {name}, {template}, {value})

DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %(name)s::text"
CREATE_DATABASE = "CREATE DATABASE {name}"
CREATE_DATABASE_FROM = "CREATE DATABASE {name} TEMPLATE {template}"
#: Its sessions are ended first.
DROP_DATABASE = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"

RELOAD_CONF = "SELECT pg_reload_conf()"
SET_SYNCHRONOUS_STANDBY_NAMES = "ALTER SYSTEM SET synchronous_standby_names = {value}"
#: Stop a standby's WAL receiver for good (as when the network to its primary fails).
CLEAR_PRIMARY_CONNINFO = "ALTER SYSTEM SET primary_conninfo = ''"
STANDBY_STREAMING = "SELECT state = 'streaming' FROM pg_stat_replication WHERE application_name = %(name)s::text"
STANDBY_SYNCHRONOUS = "SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = %(name)s::text"
WAL_RECEIVER_STOPPED = "SELECT count(*) = 0 FROM pg_stat_wal_receiver"
CURRENT_WAL_LSN = "SELECT pg_current_wal_lsn()::text"
REPLAY_LSN = "SELECT pg_last_wal_replay_lsn()::text"
REPLAYED_UP_TO = "SELECT pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn"
PROMOTE = "SELECT pg_promote(wait => true, wait_seconds => 60)"
IN_RECOVERY = "SELECT pg_is_in_recovery()"
#: The timeline a primary writes WAL on now (the first 8 hex digits of its current WAL file's name).
TIMELINE = "SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer"

# Applying pgq's SQL (pgq_thin.migrate): yoyo's bookkeeping, the migrations' lock bound ------------------

#: Every statement of an apply waits at most this long for a lock ({timeout}: a checked duration).
SET_LOCK_TIMEOUT = "SET lock_timeout = '{timeout}'"
#: pgq_thin.migrate: the applying session's list of the functions the source no longer defines
#: (sql/functions/cleanup.sql fills it instead of dropping them), read once the new functions are
#: committed, then dropped.
STALE_FUNCTIONS_TABLE = "CREATE TEMPORARY TABLE IF NOT EXISTS pgq_stale_functions (fn regprocedure NOT NULL)"
STALE_FUNCTIONS = "SELECT fn::text FROM pg_temp.pgq_stale_functions ORDER BY 1"
DROP_STALE_FUNCTIONS_TABLE = "DROP TABLE pg_temp.pgq_stale_functions"
#: The other sessions' statements running now (in this database), by pid and start.
RUNNING_STATEMENTS = ("SELECT pid, query_start FROM pg_stat_activity WHERE state = 'active' "
                      "AND pid <> pg_backend_pid() AND datname = current_database() "
                      "AND backend_type = 'client backend'")
#: A function named by its catalog signature (regprocedure's text, read from pg_proc).
DROP_FUNCTION = "DROP FUNCTION IF EXISTS {function}"
#: The migrations a database has applied, from yoyo's table ({table}: yoyo's quoted name for it).
APPLIED_MIGRATIONS = "SELECT migration_id, migration_hash FROM {table}"

# A bounded call (Client.bounded: the worker's own renewals and completions) ------------------------

#: The call runs in a transaction of its own that waits at most this long for a lock and runs at
#: most this long (BEGIN, this, the call, COMMIT: sent together, one round trip).
BEGIN = "BEGIN"
CALL_BOUNDS = ("SELECT set_config('lock_timeout', %(lock_timeout)s::text, true),"
               " set_config('statement_timeout', %(statement_timeout)s::text, true)")
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
