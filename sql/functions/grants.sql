-- sql/functions/grants.sql: which pgq role may call which function.

-- Which pgq role may call which function. Declarative: every apply takes EXECUTE on every pgq
-- function from PUBLIC and from the pgq roles, then grants exactly what is written here, in the
-- same transaction (so a function that moves to another role, or a new one, gets exactly this; a
-- grant of a pgq function to a role of the user's own is left alone). The roles and what each may
-- do are described in docs/security.md. PUBLIC has no USAGE on schema pgq either (a versioned
-- grant, in the migrations), and no role may call a function it is not granted here
-- (tests/sql/test_sql_security.py).

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC, pgq_producer, pgq_worker, pgq_admin, pgq_monitor;

GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[], text, bigint, boolean, text, timestamptz, interval, text[], interval),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[], text, bigint, boolean, text[], text, text[], interval),
    pgq.batch_open(text, text, jsonb, text, text[]),
    pgq.batch_close(bigint),
    pgq.batch_status(bigint),
    pgq.batch_jobs(bigint, text, integer, bigint),
    pgq.cancel_batch(bigint),
    pgq.signal(text, text, jsonb),
    pgq.cancel_workflow(bigint)
    TO pgq_producer;

-- A job not started, edited: by the login that enqueued it and by admins (members of pgq_producer).
GRANT EXECUTE ON FUNCTION pgq.update_job(bigint, jsonb, integer, timestamptz, jsonb) TO pgq_producer;

-- The outcome of a job: to the login that enqueued it (and readers of its queue), whichever pgq
-- role it has.
GRANT EXECUTE ON FUNCTION pgq.job_result(bigint), pgq.job_steps(bigint, integer, text) TO pgq_producer, pgq_worker, pgq_monitor;

GRANT EXECUTE ON FUNCTION
    pgq.claim(text, text[], integer, interval, text[]),
    pgq.queue_status(text[]),
    pgq.renew(bigint, integer, interval),
    pgq.complete(bigint, integer, jsonb),
    pgq.complete_many(bigint[], integer[]),
    pgq.complete_and_claim(bigint[], integer[], text, text[], integer, interval, text[]),
    pgq.fail(bigint, integer, text, interval, boolean),
    pgq.release(bigint, integer),
    pgq.snooze(bigint, integer, interval),
    pgq.mark_unknown(bigint, integer, text),
    pgq.progress(bigint, integer, jsonb),
    pgq.dependency_results(bigint, integer, integer, bigint),
    pgq.get_step(bigint, integer, text),
    pgq.get_steps(bigint, integer, text, integer),
    pgq.record_step(bigint, integer, text, jsonb),
    pgq.sleep(bigint, integer, text, interval),
    pgq.await_signal(bigint, integer, text, interval),
    pgq.spawn(bigint, integer, text, text, text, jsonb),
    pgq.await_jobs(bigint, integer, bigint[]),
    pgq.job_outcomes(bigint, integer, bigint[]),
    pgq.sweep(integer),
    pgq.settle_dependencies(integer),
    pgq.rate_limit_wait(text[]),
    pgq.worker_heartbeat(text, text[], text[], integer, text, integer, interval, boolean),
    pgq.queue_kinds(text[])
    TO pgq_worker;

GRANT EXECUTE ON FUNCTION
    pgq.cancel(bigint),
    pgq.retry(bigint),
    pgq.retry_jobs(text, text, text, timestamptz, integer, text[]),
    pgq.cancel_jobs(text, text, text, timestamptz, integer, text[]),
    pgq.delete_jobs(text, text, text, timestamptz, integer, text[]),
    pgq.resolve(bigint, text),
    pgq.prune(interval, integer),
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer, interval, interval, boolean, interval, text, boolean),
    pgq.set_tenant_weight(text, text, integer),
    pgq.set_key_limit(text, text, integer),
    pgq.pause(text, text),
    pgq.resume(text, text),
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
    pgq.job_links(bigint, integer),
    pgq.batch_status(bigint),
    pgq.batch_jobs(bigint, text, integer, bigint),
    pgq.list_jobs(text, text, text, integer, bigint, text[]),
    pgq.queue_status(text[]),
    pgq.schedules(),
    pgq.queue_grants(text),
    pgq.metrics(),
    pgq.queue_settings(text),
    pgq.queue_limits(text),
    pgq.rate_limit_wait(text[]),
    pgq.queue_kinds(text[]),
    pgq.version()
    TO pgq_monitor;

-- The live workers: every login's to pgq_monitor and pgq_admin, a worker its own login's.
GRANT EXECUTE ON FUNCTION pgq.workers() TO pgq_worker, pgq_monitor, pgq_admin;

GRANT EXECUTE ON FUNCTION pgq.version() TO pgq_producer, pgq_worker;
-- A pure function: every pgq role may compute a schedule's next firing.
GRANT EXECUTE ON FUNCTION pgq.cron_next(text, timestamptz, text)
    TO pgq_producer, pgq_worker, pgq_admin, pgq_monitor;
