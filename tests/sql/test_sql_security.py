"""Grants and search_path safety: the privilege matrix of the pgq roles over every function and
table, PUBLIC's lack of EXECUTE, pinned search_path on SECURITY DEFINER functions, and a role
that shadows names in pg_temp and public without changing any result."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from sqlfixtures import sqlstate_of
from sqlhelpers import claim, job, one

NOBODY = "pgq_test_nobody"
INTRUDER = "pgq_test_intruder"
ROLES = ["pgq_producer", "pgq_worker", "pgq_admin", "pgq_monitor", NOBODY]

# Every public function, a call of it, and the roles allowed to make it (pgq_admin is a member
# of the other three roles, so it may call everything).
PRODUCER, WORKER, ADMIN, MONITOR = ({"pgq_producer", "pgq_admin"}, {"pgq_worker", "pgq_admin"},
                                    {"pgq_admin"}, {"pgq_monitor", "pgq_admin"})
API: dict[str, tuple[str, set[str]]] = {
    "enqueue": ("SELECT pgq.enqueue('q', 'k', meta => '{}')", PRODUCER),
    "enqueue_many": ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], meta => '{}')", PRODUCER),
    "claim": ("SELECT * FROM pgq.claim('w')", WORKER),
    "renew": ("SELECT pgq.renew(1, 1)", WORKER),
    "complete": ("SELECT pgq.complete(1, 1)", WORKER),
    "complete_many": ("SELECT pgq.complete_many('{1}', '{1}')", WORKER),
    "complete_and_claim": ("SELECT * FROM pgq.complete_and_claim('{1}', '{1}', 'w')", WORKER),
    "fail": ("SELECT pgq.fail(1, 1, 'e')", WORKER),
    "release": ("SELECT pgq.release(1, 1)", WORKER),
    "snooze": ("SELECT pgq.snooze(1, 1, '1 minute')", WORKER),
    "mark_unknown": ("SELECT pgq.mark_unknown(1, 1, 'n')", WORKER),
    "progress": ("SELECT pgq.progress(1, 1, '{}')", WORKER),
    "sweep": ("SELECT pgq.sweep()", WORKER),
    "settle_dependencies": ("SELECT pgq.settle_dependencies()", WORKER),
    "dependency_results": ("SELECT * FROM pgq.dependency_results(1, 1)", WORKER),
    "get_step": ("SELECT * FROM pgq.get_step(1, 1, 'a')", WORKER),
    "get_steps": ("SELECT * FROM pgq.get_steps(1, 1)", WORKER),
    "record_step": ("SELECT pgq.record_step(1, 1, 'a', '{}')", WORKER),
    "sleep": ("SELECT * FROM pgq.sleep(1, 1, 'nap', '1 hour')", WORKER),
    "await_signal": ("SELECT * FROM pgq.await_signal(1, 1, 'go', '1 hour')", WORKER),
    "spawn": ("SELECT pgq.spawn(1, 1, 'child', 'q', 'k')", WORKER),
    "await_jobs": ("SELECT pgq.await_jobs(1, 1, '{2}')", WORKER),
    "job_outcomes": ("SELECT * FROM pgq.job_outcomes(1, 1, '{2}')", WORKER),
    "signal": ("SELECT pgq.signal('q', 'go')", PRODUCER),
    "cancel_workflow": ("SELECT pgq.cancel_workflow(1)", PRODUCER),
    "update_job": ("SELECT pgq.update_job(1, priority => 1)", PRODUCER),
    "job_steps": ("SELECT * FROM pgq.job_steps(1)", {"pgq_producer", "pgq_worker", "pgq_monitor", "pgq_admin"}),
    "batch_open": ("SELECT pgq.batch_open('q', 'k')", PRODUCER),
    "batch_close": ("SELECT pgq.batch_close(1)", PRODUCER),
    "batch_status": ("SELECT * FROM pgq.batch_status(1)", PRODUCER | MONITOR),
    "batch_jobs": ("SELECT * FROM pgq.batch_jobs(1)", PRODUCER | MONITOR),
    "cancel_batch": ("SELECT pgq.cancel_batch(1)", PRODUCER),
    "job_result": ("SELECT * FROM pgq.job_result(1)", {"pgq_producer", "pgq_worker", "pgq_monitor", "pgq_admin"}),
    "job_links": ("SELECT * FROM pgq.job_links(1)", MONITOR),
    "cancel": ("SELECT pgq.cancel(1)", ADMIN),
    "retry": ("SELECT pgq.retry(1)", ADMIN),
    "retry_jobs": ("SELECT pgq.retry_jobs('q', 'failed')", ADMIN),
    "cancel_jobs": ("SELECT pgq.cancel_jobs('q', 'pending')", ADMIN),
    "delete_jobs": ("SELECT pgq.delete_jobs('q', 'done')", ADMIN),
    "resolve": ("SELECT pgq.resolve(1, 'done')", ADMIN),
    "prune": ("SELECT pgq.prune()", ADMIN),
    "configure_queue": ("SELECT pgq.configure_queue('q', lease => '1 minute', rate_limit => 5, "
                        "rate_period => '1 minute', key_rate_limit => 1, key_sequence => 'off')", ADMIN),
    "pause": ("SELECT pgq.pause('q'), pgq.pause('q', kind => 'k')", ADMIN),
    "resume": ("SELECT pgq.resume('q', kind => 'k')", ADMIN),
    "drop_queue": ("SELECT pgq.drop_queue('q')", ADMIN),
    "stats": ("SELECT * FROM pgq.stats()", MONITOR),
    "health": ("SELECT * FROM pgq.health()", MONITOR),
    "metrics": ("SELECT * FROM pgq.metrics()", MONITOR),
    "set_tenant_weight": ("SELECT pgq.set_tenant_weight('q', 't', 2)", ADMIN),
    "set_key_limit": ("SELECT pgq.set_key_limit('q', 'customer-1', 2)", ADMIN),
    "schedule": ("SELECT pgq.schedule('s', 'q', 'k', every => '1 hour')", ADMIN),
    "unschedule": ("SELECT pgq.unschedule('s')", ADMIN),
    "grant_queue": ("SELECT pgq.grant_queue('q', 'pgq_worker', 'claim')", ADMIN),
    "revoke_queue": ("SELECT pgq.revoke_queue('q', 'pgq_worker', 'claim')", ADMIN),
    "queue_grants": ("SELECT * FROM pgq.queue_grants()", MONITOR),
    "queue_settings": ("SELECT * FROM pgq.queue_settings()", MONITOR),
    "queue_limits": ("SELECT * FROM pgq.queue_limits()", MONITOR),
    "rate_limit_wait": ("SELECT * FROM pgq.rate_limit_wait('{q}')", {"pgq_worker", "pgq_monitor", "pgq_admin"}),
    "schedules": ("SELECT * FROM pgq.schedules()", MONITOR),
    "get_job": ("SELECT * FROM pgq.get_job(1)", MONITOR),
    "job_history": ("SELECT * FROM pgq.job_history(1)", MONITOR),
    "list_jobs": ("SELECT * FROM pgq.list_jobs()", MONITOR),
    "queue_status": ("SELECT * FROM pgq.queue_status('{q}')", {"pgq_worker", "pgq_monitor", "pgq_admin"}),
    "worker_heartbeat": ("SELECT pgq.worker_heartbeat('w')", WORKER),
    "workers": ("SELECT * FROM pgq.workers()", {"pgq_worker", "pgq_monitor", "pgq_admin"}),
    "queue_kinds": ("SELECT * FROM pgq.queue_kinds('{q}')", {"pgq_worker", "pgq_monitor", "pgq_admin"}),
    "version": ("SELECT pgq.version()", {"pgq_producer", "pgq_worker", "pgq_monitor", "pgq_admin"}),
    "cron_next": ("SELECT pgq.cron_next('0 * * * *', now())",
                  {"pgq_producer", "pgq_worker", "pgq_monitor", "pgq_admin"}),
}
TABLE_STATEMENTS = [
    "SELECT * FROM pgq.{t}",
    "INSERT INTO pgq.{t} DEFAULT VALUES",
    "UPDATE pgq.{t} SET {c} = {c}",
    "DELETE FROM pgq.{t}",
    "TRUNCATE pgq.{t}",
    "SELECT 1 FROM pgq.{t} FOR KEY SHARE",
]
TABLES = {"jobs": "queue", "queues": "name", "job_events": "note", "tenants": "tenant", "schedules": "name",
          "fence": "timeline", "grants": "queue",
          "finished_counts": "total", "finished_deltas": "queue", "key_limits": "key", "key_rates": "key",
          "key_slots": "slot", "key_locks": "key", "rate_buckets": "rate", "rate_slices": "taken",
          "job_dependants": "job_id", "batches": "run_when", "batch_counts": "done", "batch_members": "job_id",
          "unique_successors": "unique_key", "replace_slots": "unique_key", "overlap_checks": "login",
          "cascade_backlog": "login", "cascade_budgets": "budget", "dependency_checks": "job_id",
          "dependency_backlog": "job_id", "steps": "name", "signals": "name", "signal_checks": "name",
          "signal_grants": "queue", "archive": "queue", "archive_events": "note", "archive_cursors": "queue",
          "claim_floors": "keys"}


def ensure_role(admin: psycopg.Connection, name: str, *member_of: str) -> None:
    if admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
        try:
            admin.execute(f"CREATE ROLE {name} NOLOGIN")
        except psycopg.errors.DuplicateObject:
            pass
    for role in member_of:
        admin.execute(f"GRANT {role} TO {name}")


@pytest.fixture
def roles(conn: psycopg.Connection) -> None:
    ensure_role(conn, NOBODY)
    ensure_role(conn, INTRUDER, "pgq_admin")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    assert job_id == 1
    claim(conn)  # job 1 is running at attempt 1


def internal_calls(conn: psycopg.Connection) -> dict[str, str]:
    """A call of every _-prefixed helper, with NULL arguments of the right types."""
    rows = conn.execute("""
        SELECT p.proname, coalesce(string_agg(format('NULL::%s', format_type(t.oid, NULL)), ', '
                                              ORDER BY a.n) FILTER (WHERE a.typ IS NOT NULL), '')
        FROM pg_proc AS p
        LEFT JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(typ, n) ON true
        LEFT JOIN pg_type AS t ON t.oid = a.typ
        WHERE p.pronamespace = 'pgq'::regnamespace AND p.proname LIKE '\\_%'
        GROUP BY p.oid, p.proname""").fetchall()
    return {name: f"SELECT pgq.{name}({args})" for name, args in rows}


def test_the_matrix_lists_every_public_function(conn):
    public = {r[0] for r in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'pgq'::regnamespace AND proname NOT LIKE '\\_%'")}
    assert public == set(API)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_may_call_exactly_its_functions_and_gets_42501_for_the_others(roles, connect, role):
    c = connect(role=role)
    assert one(c, "SELECT current_user") == role
    for name, (sql, allowed) in API.items():
        state = sqlstate_of(c, sql)
        if role in allowed:
            assert state != "42501", f"{role} may call pgq.{name}"
        else:
            assert state == "42501", f"{role} must not call pgq.{name} (got {state})"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_call_an_internal_helper(roles, conn, connect, role):
    calls = internal_calls(conn)
    assert {"_now", "_queue", "_reject", "_recover_expired", "_backoff", "_check_fence",
            "_next_fire", "_fire_schedules"} <= set(calls)
    c = connect(role=role)
    for name, sql in calls.items():
        assert sqlstate_of(c, sql) == "42501", f"{role} called pgq.{name}"


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_touch_a_table_or_sequence_directly(roles, conn, connect, role):
    before = conn.execute("SELECT (SELECT count(*) FROM pgq.jobs), (SELECT count(*) FROM pgq.queues), "
                          "(SELECT count(*) FROM pgq.job_events)").fetchone()
    c = connect(role=role)
    for table, column in TABLES.items():
        for template in TABLE_STATEMENTS:
            sql = template.format(t=table, c=column)
            assert sqlstate_of(c, sql) == "42501", f"{role}: {sql}"
    # Every sequence of the schema, the lease floor's among them (a login that could set it would
    # hide expired leases from every claim): neither advanced, set nor read.
    seqs = [r[0] for r in conn.execute("SELECT relname::text FROM pg_class"
                                       " WHERE relnamespace = 'pgq'::regnamespace AND relkind = 'S'")]
    assert {"jobs_id_seq", "job_events_id_seq", "lease_floor", "lease_floor_checked",
            "claim_floors_set"} <= set(seqs), seqs
    for seq in seqs:
        for sql in (f"SELECT nextval('pgq.{seq}')", f"SELECT setval('pgq.{seq}', 4000000000000000)"):
            assert sqlstate_of(c, sql) == "42501", f"{role}: {sql}"
        read = f"SELECT pg_sequence_last_value('pgq.{seq}')"  # (PostgreSQL 18 answers NULL, not 42501)
        assert sqlstate_of(c, read) == "42501" or one(c, read) is None, f"{role}: {read}"
    assert sqlstate_of(c, "CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz "
                          "LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$") == "42501"
    assert sqlstate_of(c, "CREATE TABLE pgq.mine (x int)") == "42501"
    after = conn.execute("SELECT (SELECT count(*) FROM pgq.jobs), (SELECT count(*) FROM pgq.queues), "
                         "(SELECT count(*) FROM pgq.job_events)").fetchone()
    assert after == before


def test_public_has_no_execute_on_any_pgq_function(roles, conn):
    rows = conn.execute("""
        SELECT p.oid::regprocedure::text, p.proacl IS NULL,
               EXISTS (SELECT FROM aclexplode(p.proacl) AS a WHERE a.grantee = 0),
               has_function_privilege(%s, p.oid, 'EXECUTE')
        FROM pg_proc AS p WHERE p.pronamespace = 'pgq'::regnamespace""", (NOBODY,)).fetchall()
    assert len(rows) >= 30
    for name, default_acl, public_granted, nobody_may in rows:
        assert not default_acl, f"{name} has the default ACL, which grants EXECUTE to PUBLIC"
        assert not public_granted, f"PUBLIC may execute {name}"
        assert not nobody_may, f"{NOBODY} may execute {name}"
    assert not one(conn, "SELECT has_schema_privilege(%s, 'pgq', 'USAGE')", (NOBODY,))


def test_every_security_definer_function_pins_its_search_path(conn):
    rows = conn.execute("""
        SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc AS p
        WHERE p.pronamespace = 'pgq'::regnamespace""").fetchall()
    definers = {name for name, secdef, _ in rows if secdef}
    assert definers == set(API) - {"version"}
    for name, secdef, config in rows:
        if secdef:
            assert config is not None and "search_path=pgq, pg_temp" in config, (name, config)


# search_path hijack ------------------------------------------------------------------------------

SHADOWS = [
    # In pg_temp: pg_temp is searched first by default, for relations and types.
    "CREATE TEMP TABLE jobs (id bigint, queue text, state text, attempt int, lease_until timestamptz)",
    "INSERT INTO jobs VALUES (1, 'decoy', 'pending', 0, NULL)",
    "CREATE TEMP TABLE queues (name text, paused boolean, lease interval)",
    "INSERT INTO queues VALUES ('decoy', false, '1 second')",
    "CREATE TEMP TABLE job_events (job_id bigint)",
    "CREATE TEMP VIEW claimed_job AS SELECT 1 AS id",
    "CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION pg_temp._now() RETURNS timestamptz LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    # In public: better matches than pg_catalog's for the calls pgq makes, if public were searched.
    "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public._now() RETURNS timestamptz LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public._check_name(text, text) RETURNS void LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public._backoff(integer, interval, interval) RETURNS interval "
    "LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.random() RETURNS float8 LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.jsonb_typeof(jsonb) RETURNS text LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.pg_column_size(jsonb) RETURNS int LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.length(text) RETURNS int LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.left(text, int) RETURNS text LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.cardinality(text[]) RETURNS int LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE FUNCTION public.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.text_eq)",
    "CREATE FUNCTION public.int_lt(integer, integer) RETURNS boolean LANGUAGE plpgsql"
    " AS $$BEGIN RAISE 'hijacked'; END$$",
    "CREATE OPERATOR public.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.int_lt)",
]


def scenario(c: psycopg.Connection, su: psycopg.Connection, queue: str) -> list[Any]:
    """Calls every API function once or more on `queue`; returns what a caller would observe,
    with ids renamed by order of creation and times reduced to what does not depend on the clock."""
    out: list[Any] = []
    out.append(c.execute("SELECT max_attempts, lease FROM pgq.configure_queue(%s, backoff_base => '1 hour', "
                         "backoff_cap => '2 hours', max_attempts => 6)", (queue,)).fetchone())
    a = one(c, "SELECT pgq.enqueue(%s, 'k', '{\"n\": 1}', priority => 1, unique_key => 'u')", (queue,))
    out.append(one(c, "SELECT pgq.enqueue(%s, 'k', unique_key => 'u')", (queue,)) == a)
    b, d = [r[0] for r in c.execute(
        "SELECT * FROM pgq.enqueue_many(%s, 'k', ARRAY['{\"n\": 2}', '{\"n\": 3}']::jsonb[])", (queue,))]
    name = {a: "a", b: "b", d: "d"}

    def claimed(batch: int = 3) -> list[tuple]:
        return [(name[x["id"]], x["attempt"], x["payload"], x["priority"], x["max_attempts"])
                for x in claim(c, worker="w", queues=[queue], batch=batch)]

    out.append(claimed())
    # The test's own SQL qualifies pg_catalog: the intruder's session resolves now() and = to its shadows.
    out.append(one(c, "SELECT pgq.renew(%s, 1) > pg_catalog.now()", (a,)))
    out.append(one(c, "SELECT pgq.progress(%s, 1, '{\"step\": 1}')", (a,)))
    out.append(one(c, "SELECT pgq.complete(%s, 1, '{\"r\": 1}')", (a,)))
    out.append(one(c, "SELECT pgq.complete(%s, 1)", (a,)))
    out.append(one(c, "SELECT pgq.complete(%s, 2)", (a,)))
    out.append(one(c, "SELECT pgq.fail(%s, 1, 'boom')", (b,)))
    out.append(one(c, "SELECT pgq.mark_unknown(%s, 1, 'hm')", (d,)))
    out.append(one(c, "SELECT pgq.resolve(%s, 'pending')", (d,)))
    out.append(one(c, "SELECT pgq.cancel(%s)", (d,)))
    out.append(one(c, "SELECT pgq.retry(%s)", (d,)))
    out.append(claimed())
    su.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (d,))
    out.append(one(c, "SELECT pgq.sweep()"))
    out.append(one(c, "SELECT pgq.settle_dependencies()"))
    out.append(claimed())
    out.append(one(c, "SELECT pgq.release(%s, 3)", (d,)))
    out.append(claimed())
    out.append(one(c, "SELECT pgq.snooze(%s, 4, '1 hour') > pg_catalog.now()", (d,)))
    su.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = ANY(%s)", ([b, d],))
    out.append(claimed())
    out.append(sorted(name[r[0]] for r in c.execute(
        "SELECT * FROM pgq.complete_many(%s, %s)", ([b, d], [2, 5]))))
    out.append(c.execute("SELECT kind, every, next_run_at > pg_catalog.now() FROM pgq.schedule(%s, %s, 'k', "
                         "every => '1 minute', payload => '{\"s\": 1}')", (queue, queue)).fetchone())
    su.execute("UPDATE pgq.schedules SET next_run_at = next_run_at - interval '1 minute' WHERE name = %s", (queue,))
    out.append(one(c, "SELECT pgq.sweep()"))
    out.append([(x["kind"], x["payload"]) for x in claim(c, worker="w", queues=[queue], batch=3)])
    out.append([(r[1], r[2]) for r in c.execute("SELECT name, kind, skipped FROM pgq.schedules()") if r[0] == queue])
    out.append(one(c, "SELECT pgq.unschedule(%s)", (queue,)))
    out.append(c.execute("SELECT max_run_time FROM pgq.configure_queue(%s, max_run_time => '1 hour')",
                         (queue,)).fetchone())
    t = one(c, "SELECT pgq.enqueue(%s, 'k', '{\"n\": 4}', max_run_time => '10 minutes')", (queue,))
    (tc,) = claim(c, worker="w", queues=[queue], lease="1 hour")
    out.append((tc["id"] == t, tc["deadline"] - tc["lease_until"]))
    su.execute("UPDATE pgq.jobs SET lease_until = pg_catalog.now() - interval '1 second', "
               "deadline = pg_catalog.now() - interval '1 second' WHERE id = %s", (t,))
    out.append(one(c, "SELECT pgq.sweep()"))
    out.append(c.execute("SELECT state::text, last_event FROM pgq.get_job(%s)", (t,)).fetchone())
    out.extend(durable_scenario(c, queue + "_flow"))
    out.append(c.execute("SELECT paused FROM pgq.pause(%s)", (queue,)).fetchone())
    out.append(c.execute("SELECT paused FROM pgq.resume(%s)", (queue,)).fetchone())
    out.append(one(c, "SELECT pgq.prune(interval '1 day')"))
    stats = c.execute("SELECT queue, pending, scheduled, running, expired, done, failed, cancelled, "
                      "outcome_unknown FROM pgq.stats()").fetchall()
    out.append([row[1:] for row in stats if row[0] == queue])
    out.append(one(c, "SELECT pgq.version()"))
    for job_id in (a, b, d):
        row = job(su, job_id)
        error = re.sub(r"\d{4}-\d\d-\d\d [0-9:.+]+", "<time>", row["last_error"] or "")
        out.append((name[job_id], row["state"], row["attempt"], row["max_attempts"], row["last_event"],
                    error, row["payload"], row["result"]))
    out.append(su.execute("SELECT event, attempt, from_state::text, to_state::text FROM pgq.job_events "
                          "WHERE job_id = ANY(%s) ORDER BY job_id, id", ([a, b, d],)).fetchall())
    return out


def durable_scenario(c: psycopg.Connection, flow: str) -> list[Any]:
    """The durable calls (issue 39) on queue `flow`: steps, a spawned child awaited, a signal wait,
    a sleep, the steps read back, the workflow cancelled."""
    out: list[Any] = []
    root = one(c, "SELECT pgq.enqueue(%s, 'root')", (flow,))

    def attempt(job_id: int) -> int:
        (x,) = claim(c, worker="w", queues=[flow])
        assert x["id"] == job_id
        return int(x["attempt"])

    r1 = attempt(root)
    out.append(one(c, "SELECT pgq.record_step(%s, %s, 's', '{\"v\": 1}')", (root, r1)))
    out.append(c.execute("SELECT found, result FROM pgq.get_step(%s, %s, 's')", (root, r1)).fetchall())
    out.append(c.execute("SELECT name, result FROM pgq.get_steps(%s, %s)", (root, r1)).fetchall())
    child = one(c, "SELECT pgq.spawn(%s, %s, 'c', %s, 'child', '{\"n\": 1}')", (root, r1, flow))
    out.append(one(c, "SELECT pgq.spawn(%s, %s, 'c', %s, 'child')", (root, r1, flow)) == child)
    out.append(one(c, "SELECT pgq.await_jobs(%s, %s, ARRAY[%s]::bigint[])", (root, r1, child)))
    c1 = attempt(child)
    wait = "SELECT status, payload FROM pgq.await_signal(%s, %s, 'go', '1 hour')"
    out.append(c.execute(wait, (child, c1)).fetchall())
    out.append(one(c, "SELECT pgq.signal(%s, 'go', '{\"ok\": 1}')", (flow,)))
    c2 = attempt(child)
    out.append(c.execute(wait, (child, c2)).fetchall())
    out.append(one(c, "SELECT pgq.complete(%s, %s, '{\"done\": 1}')", (child, c2)))
    r2 = attempt(root)
    out.append(one(c, "SELECT pgq.await_jobs(%s, %s, ARRAY[%s]::bigint[])", (root, r2, child)))
    out.append(c.execute("SELECT job_id = %s, state, result FROM pgq.job_outcomes(%s, %s, ARRAY[%s]::bigint[])",
                         (child, root, r2, child)).fetchall())
    out.append(c.execute("SELECT status FROM pgq.sleep(%s, %s, 'nap', '1 hour')", (root, r2)).fetchall())
    out.append(c.execute("SELECT name, attempt, result->'job_id' = to_jsonb(%s::bigint), result ? 'until' "
                         "FROM pgq.job_steps(%s)", (child, root)).fetchall())
    out.append(one(c, "SELECT pgq.cancel_workflow(%s)", (child,)))
    out.append(c.execute("SELECT state::text, workflow_id IS NULL FROM pgq.get_job(%s)", (root,)).fetchone())
    return out


def test_a_role_shadowing_names_in_pg_temp_and_public_changes_no_result(roles, conn, connect):
    conn.execute(f"GRANT CREATE ON SCHEMA public TO {INTRUDER}")
    clean = scenario(connect(role="pgq_admin"), conn, "clean")

    intruder = connect(role=INTRUDER)
    for sql in SHADOWS:
        intruder.execute(sql)
    intruder.execute("SET search_path = pg_temp, public, pgq, pg_catalog")
    # The shadows work where the search_path is not pinned ...
    for probe in ("SELECT now()", "SELECT random()", "SELECT length('x'::text)", "SELECT 'a'::text = 'a'::text"):
        assert sqlstate_of(intruder, probe) == "P0001", probe
    assert one(intruder, "SELECT count(*) FROM jobs") == 1  # the temp table, not pgq.jobs
    # ... and change nothing inside pgq.
    hijacked = scenario(intruder, conn, "hijacked")
    assert hijacked == clean
    assert intruder.execute("SELECT id, queue, state FROM pg_temp.jobs").fetchall() == [(1, "decoy", "pending")]
    assert intruder.execute("SELECT name FROM pg_temp.queues").fetchall() == [("decoy",)]
    assert one(intruder, "SELECT count(*) FROM pg_temp.job_events") == 0
    # Sanity: the scenario did real work.
    assert clean[2] == [("a", 1, {"n": 1}, 1, 6), ("b", 1, {"n": 2}, 0, 6), ("d", 1, {"n": 3}, 0, 6)]
    assert ("a", "done", 1, 6, "completed", "", {"n": 1}, {"r": 1}) in clean
    assert [("k", {"s": 1})] in clean  # the schedule fired, and its job was claimed
    assert ("pending", "timed_out") in clean  # the attempt with max_run_time timed out
    assert ("d", "done", 5, 8, "completed", "lease expired at <time> (attempt 2, worker w)", {"n": 3}, None) in clean
