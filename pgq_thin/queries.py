"""Every statement pgq_thin sends, in one place: each calls exactly one pgq function, with named
arguments and explicit casts. Nothing here decides queue state; the functions do."""

from __future__ import annotations

# Producers ---------------------------------------------------------------------------------------

#: Add one job; returns its id (or the id of the live job holding unique_key).
ENQUEUE = (
    "SELECT pgq.enqueue(queue => %(queue)s::text, kind => %(kind)s::text,"
    " payload => %(payload)s::jsonb, run_at => coalesce(%(run_at)s::timestamptz, now()),"
    " priority => %(priority)s::integer, max_attempts => %(max_attempts)s::integer,"
    " unique_key => %(unique_key)s::text, tenant => %(tenant)s::text,"
    " max_run_time => %(max_run_time)s::interval, meta => %(meta)s::jsonb,"
    " concurrency_key => %(concurrency_key)s::text, depends_on => %(depends_on)s::bigint[])"
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
    " concurrency_key => %(concurrency_key)s::text, depends_on => %(depends_on)s::bigint[]) AS t(id)"
)

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
RATE_LIMIT_WAIT = "SELECT queue, wait FROM pgq.rate_limit_wait(queues => %(queues)s::text[])"

#: Extend the lease of our attempt; NULL when the job is no longer ours.
RENEW = "SELECT pgq.renew(id => %(id)s::bigint, attempt => %(attempt)s::integer, lease => %(lease)s::interval)"

#: Finish our attempt; false when the job is no longer ours.
COMPLETE = "SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer, result => %(result)s::jsonb)"

#: Finish several attempts; returns the ids completed.
COMPLETE_MANY = (
    "SELECT id FROM pgq.complete_many(ids => %(ids)s::bigint[], attempts => %(attempts)s::integer[]) AS t(id)"
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

# Admin -------------------------------------------------------------------------------------------

CANCEL = "SELECT pgq.cancel(id => %(id)s::bigint)"
RETRY = "SELECT pgq.retry(id => %(id)s::bigint)"
RESOLVE = "SELECT pgq.resolve(id => %(id)s::bigint, state => %(state)s::text)"
PRUNE = "SELECT pgq.prune(older_than => %(older_than)s::interval, max_jobs => %(max_jobs)s::integer)"
PAUSE = "SELECT * FROM pgq.pause(queue => %(queue)s::text)"
DROP_QUEUE = "SELECT pgq.drop_queue(queue => %(queue)s::text)"
RESUME = "SELECT * FROM pgq.resume(queue => %(queue)s::text)"
CONFIGURE_QUEUE = (
    "SELECT * FROM pgq.configure_queue(queue => %(queue)s::text, lease => %(lease)s::interval,"
    " max_attempts => %(max_attempts)s::integer, backoff_base => %(backoff_base)s::interval,"
    " backoff_cap => %(backoff_cap)s::interval, retention => %(retention)s::interval,"
    " notify => %(notify)s::boolean, audit => %(audit)s::boolean, fair => %(fair)s::boolean,"
    " max_running => %(max_running)s::integer, max_run_time => %(max_run_time)s::interval,"
    " key_max_running => %(key_max_running)s::integer, rate_limit => %(rate_limit)s::integer,"
    " rate_period => %(rate_period)s::interval, key_rate_limit => %(key_rate_limit)s::integer)"
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
    " limit_rows => %(limit_rows)s::integer, before_id => %(before_id)s::bigint)"
)
GET_JOB = "SELECT * FROM pgq.get_job(id => %(id)s::bigint)"
JOB_HISTORY = "SELECT * FROM pgq.job_history(id => %(id)s::bigint)"
VERSION = "SELECT pgq.version()"
