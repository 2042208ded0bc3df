"""The statements the lab sends. Every queue state change goes through a pgq function; the few
raw statements on pgq.jobs either read (snapshots, the expected rank) or are about PostgreSQL
itself (the blocking FOR UPDATE / NOWAIT controls, a row lock held on purpose)."""

from __future__ import annotations

# The statements written to claim.sql, complete.sql and recover.sql -------------------------------

#: Claim up to batch due jobs (pgq.claim); each row carries its fencing token, attempt.
CLAIM = (
    "SELECT id, attempt, priority, run_at, lease_until, payload"
    " FROM pgq.claim(worker => %(worker)s::text, queues => %(queues)s::text[],"
    " batch => %(batch)s::integer, lease => %(lease)s::interval)"
)

#: Finish an attempt (pgq.complete); false when the caller no longer owns the job.
COMPLETE = "SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer) AS completed"

#: Recover running jobs whose lease expired (pgq.sweep); returns how many.
RECOVER = "SELECT pgq.sweep(max_jobs => %(max_jobs)s::integer) AS recovered"

#: Extend a lease (pgq.renew); NULL when not yours.
RENEW = "SELECT pgq.renew(id => %(id)s::bigint, attempt => %(attempt)s::integer) AS lease_until"

#: Which template a step instantiates (for the evidence files).
TEMPLATES = {CLAIM: "claim", COMPLETE: "complete", RECOVER: "recover", RENEW: "renew"}

# Fixtures ----------------------------------------------------------------------------------------

#: n jobs in one queue, all due at run_at (a fixed past time, or now() when NULL): their total
#: order is their id order.
ENQUEUE_COHORT = (
    "SELECT id FROM pgq.enqueue_many(queue => %(queue)s::text, kind => %(kind)s::text,"
    " payloads => ARRAY(SELECT jsonb_build_object('cohort', %(cohort)s::text, 'n', n)"
    " FROM generate_series(1, %(n)s::integer) AS n),"
    " run_at => coalesce(%(run_at)s::timestamptz, now())) AS t(id)"
)

#: A fixed time in the past: the fixtures' run_at, so that the total order is reproducible.
EPOCH = "2025-01-01 09:00:00+00"

# Observation -------------------------------------------------------------------------------------

#: The claimable jobs of a queue in pgq.claim's documented total order (priority DESC, run_at, id):
#: the "expected rank" snapshot, and the seed's skip-probe snapshot.
READY_SNAPSHOT = (
    "SELECT id, priority, run_at, attempt, payload->>'cohort' AS cohort FROM pgq.jobs"
    " WHERE queue = %(queue)s AND state = 'pending' AND attempt < max_attempts AND run_at <= now()"
    " ORDER BY priority DESC, run_at, id"
)

#: One job as an observer sees it (a plain read: never blocked by row locks).
JOB = (
    "SELECT id, state::text AS state, attempt, claimed_by, lease_until, last_event"
    " FROM pgq.jobs WHERE id = %(id)s"
)

#: The attempt history of some jobs.
EVENTS = (
    "SELECT id, job_id, attempt, worker, event, from_state::text AS from_state,"
    " to_state::text AS to_state, at, note FROM pgq.job_events"
    " WHERE job_id = ANY(%(ids)s::bigint[]) ORDER BY id"
)

#: Sleep on the server until every running job of the given ids has an expired lease.
WAIT_LEASE_EXPIRY = (
    "SELECT pg_sleep(greatest(0, extract(epoch FROM max(lease_until) - clock_timestamp()) + 0.05))"
    " FROM pgq.jobs WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running'"
)
