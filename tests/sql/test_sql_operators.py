"""The operator's day in SQL: pgq.list_jobs (paging, filters, roles), pgq.claim's kinds (a job of
a kind no worker claims waits untouched), pgq.queue_status, and pgq.health's unclaimed_kind."""

from __future__ import annotations

import threading

import psycopg
import pytest

from healthkit import findings
from sqlhelpers import claim, job, one


def ids_of(conn: psycopg.Connection, sql: str, params: object = None) -> list[int]:
    return [r[0] for r in conn.execute(sql, params).fetchall()]


def claim_kinds(conn: psycopg.Connection, kinds: list[str] | None, queues: list[str] | None = None,
                batch: int = 10, worker: str = "w") -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT id, kind FROM pgq.claim(worker => %s, queues => %s::text[], batch => %s, kinds => %s::text[])",
        (worker, queues, batch, kinds)).fetchall()]


# list_jobs -------------------------------------------------------------------------------------------

@pytest.fixture
def mixed(conn: psycopg.Connection) -> dict[str, list[int]]:
    """Jobs of two queues and two kinds in every state, ids ascending in the order made."""
    made: dict[str, list[int]] = {}

    def add(queue: str, kind: str, state: str) -> int:
        job_id = one(conn, "SELECT pgq.enqueue(%s, %s)", (queue, kind))
        if state != "pending":
            conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 hour' WHERE id = %s", (job_id,))
            [c] = conn.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY[%s], kinds => ARRAY[%s])",
                               (queue, kind)).fetchall()
            assert c[0] == job_id
            if state == "done":
                conn.execute("SELECT pgq.complete(%s, %s)", c)
            elif state == "failed":
                conn.execute("SELECT pgq.fail(%s, %s, 'boom', retryable => false)", c)
            elif state == "outcome_unknown":
                conn.execute("SELECT pgq.mark_unknown(%s, %s, 'unsure')", c)
            elif state == "cancelled":
                conn.execute("SELECT pgq.cancel(%s)", (job_id,))
        made.setdefault(f"{queue}/{kind}/{state}", []).append(job_id)
        made.setdefault("all", []).append(job_id)
        return job_id

    for i in range(3):
        for state in ("done", "failed", "running", "pending", "cancelled", "outcome_unknown"):
            add("emails", "welcome" if i % 2 == 0 else "digest", state)
            add("billing", "charge", state)
    return made


def test_list_jobs_pages_newest_first_by_id_until_the_end(conn: psycopg.Connection, mixed: dict) -> None:
    everything = sorted(mixed["all"], reverse=True)
    assert ids_of(conn, "SELECT id FROM pgq.list_jobs()") == everything  # fewer than 50
    pages, before = [], None
    while True:
        page = ids_of(conn, "SELECT id FROM pgq.list_jobs(limit_rows => 7, before_id => %s)", (before,))
        if not page:
            break
        assert len(page) <= 7
        pages.append(page)
        before = page[-1]
    assert [i for p in pages for i in p] == everything
    assert [len(p) for p in pages] == [7, 7, 7, 7, 7, 1]


def test_list_jobs_filters_by_queue_state_and_kind(conn: psycopg.Connection, mixed: dict) -> None:
    def listed(**filters: object) -> list[int]:
        args = ", ".join(f"{k} => %({k})s" for k in filters)
        return ids_of(conn, f"SELECT id FROM pgq.list_jobs({args})", filters)

    def expected(queue: str = "*", kind: str = "*", state: str = "*") -> list[int]:
        keys = [k for k in mixed if k != "all"]
        return sorted((i for k in keys for i in mixed[k]
                       if all(want in ("*", got) for want, got in zip((queue, kind, state), k.split("/")))),
                      reverse=True)

    assert listed(queue="billing") == expected(queue="billing")
    for state in ("pending", "running", "done", "failed", "cancelled", "outcome_unknown"):
        assert listed(state=state) == expected(state=state), state
        assert listed(queue="emails", state=state) == expected(queue="emails", state=state), state
    assert listed(kind="digest") == expected(kind="digest")
    assert listed(queue="emails", kind="welcome", state="failed") == expected("emails", "welcome", "failed")
    assert listed(queue="billing", kind="welcome") == []
    assert listed(kind="no_such_kind") == []
    # The rows are whole jobs, as pgq.get_job returns them.
    [failed] = conn.execute("SELECT id, state::text, last_error FROM pgq.list_jobs(queue => 'billing', "
                            "state => 'failed', limit_rows => 1)").fetchall()
    assert failed[0] == expected("billing", "charge", "failed")[0] and failed[1:] == ("failed", "boom")


def test_list_jobs_refuses_what_cannot_name_anything(conn: psycopg.Connection, mixed: dict) -> None:
    cases = [
        ("SELECT * FROM pgq.list_jobs(queue => 'emials')", "22023", 'argument "queue" names no queue: \'emials\''),
        ("SELECT * FROM pgq.list_jobs(queue => 'bad queue!')", "22023", 'argument "queue" is not a valid name'),
        ("SELECT * FROM pgq.list_jobs(state => 'finished')", "22023",
         'argument "state" must be one of waiting, pending, running, done, failed, cancelled, outcome_unknown, '
         "got 'finished'"),
        ("SELECT * FROM pgq.list_jobs(kind => 'a;b')", "22023", 'argument "kind" is not a valid name'),
        ("SELECT * FROM pgq.list_jobs(limit_rows => 0)", "22023", 'argument "limit_rows" must be between 1 and 1000'),
        ("SELECT * FROM pgq.list_jobs(limit_rows => 1001)", "22023", 'argument "limit_rows" must be between'),
        ("SELECT * FROM pgq.list_jobs(limit_rows => NULL)", "22004", 'argument "limit_rows" must not be NULL'),
    ]
    for sql, sqlstate, message in cases:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert err.value.sqlstate == sqlstate, sql
        assert message in (err.value.diag.message_primary or ""), (sql, err.value.diag.message_primary)


def test_list_jobs_is_for_admin_and_monitor_logins_that_cannot_read_the_table(
        connect, conn: psycopg.Connection, mixed: dict) -> None:
    newest = max(mixed["all"])
    for role in ("pgq_admin", "pgq_monitor"):
        c = connect(role=role)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT id FROM pgq.jobs")
        assert ids_of(c, "SELECT id FROM pgq.list_jobs(limit_rows => 1)") == [newest], role
    for role in ("pgq_worker", "pgq_producer"):
        c = connect(role=role)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM pgq.list_jobs()")


# claim with kinds ----------------------------------------------------------------------------------------

def test_a_job_of_a_kind_the_worker_cannot_run_waits_untouched_while_a_capable_worker_runs_it(
        conn: psycopg.Connection) -> None:
    new_kind = one(conn, "SELECT pgq.enqueue('q', 'send_sms', priority => 10)")  # first in line
    old = [one(conn, "SELECT pgq.enqueue('q', 'send_mail')") for _ in range(3)]
    # An old worker knows only send_mail: it takes all of those and leaves send_sms alone.
    assert claim_kinds(conn, ["send_mail"], ["q"]) == [(i, "send_mail") for i in old]
    assert claim_kinds(conn, ["send_mail"], ["q"]) == []
    untouched = job(conn, new_kind)
    assert (untouched["state"], untouched["attempt"], untouched["claimed_by"]) == ("pending", 0, None)
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s", (new_kind,)) == 0
    # A new worker runs it.
    assert claim_kinds(conn, ["send_mail", "send_sms"], ["q"], worker="new") == [(new_kind, "send_sms")]
    conn.execute("SELECT pgq.complete(%s, 1)", (new_kind,))
    assert job(conn, new_kind)["state"] == "done"


def test_kinds_keep_the_total_order_across_kinds_and_queues(conn: psycopg.Connection) -> None:
    a1 = one(conn, "SELECT pgq.enqueue('a', 'x')")
    b1 = one(conn, "SELECT pgq.enqueue('b', 'y', priority => 5)")
    a2 = one(conn, "SELECT pgq.enqueue('a', 'y')")
    one(conn, "SELECT pgq.enqueue('a', 'z', priority => 9)")  # not asked for
    b2 = one(conn, "SELECT pgq.enqueue('b', 'x')")
    got = claim_kinds(conn, ["x", "y", "x"], ["a", "b"], batch=3)  # a kind named twice counts once
    assert [i for i, _ in got] == [b1, a1, a2]
    assert claim_kinds(conn, ["y", "x"], None, batch=10) == [(b2, "x")]


def test_kinds_apply_to_fair_and_capped_queues(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('fair', fair => true)")
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 2)")
    fair_skip = [one(conn, "SELECT pgq.enqueue('fair', 'other', tenant => %s)", (t,)) for t in ("t1", "t2")]
    fair_take = [one(conn, "SELECT pgq.enqueue('fair', 'mine', tenant => %s)", (t,)) for t in ("t1", "t2")]
    capped_skip = one(conn, "SELECT pgq.enqueue('capped', 'other', priority => 10)")
    capped_take = [one(conn, "SELECT pgq.enqueue('capped', 'mine')") for _ in range(3)]
    got = claim_kinds(conn, ["mine"], ["fair", "capped"], batch=10)
    assert sorted(i for i, _ in got) == sorted(fair_take + capped_take[:2])  # the cap holds
    assert {k for _, k in got} == {"mine"}
    assert all(job(conn, i)["state"] == "pending" for i in fair_skip + [capped_skip, capped_take[2]])


@pytest.mark.parametrize("kinds, sqlstate, message", [
    ("'{}'", "22023", 'argument "kinds" must be NULL (any kind) or an array of 1 to 1000 kinds without NULLs'),
    ("ARRAY['a', NULL]", "22023", 'argument "kinds" must be NULL (any kind)'),
    ("ARRAY['ok', 'not ok']", "22023", 'argument "kinds[2]" is not a valid name'),
    ("ARRAY[repeat('k', 129)]", "22023", 'argument "kinds[1]" is not a valid name'),
    ("array_fill('k'::text, ARRAY[1001])", "22023", "an array of 1 to 1000 kinds"),
])
def test_bad_kinds_are_refused_and_claim_nothing(conn: psycopg.Connection, kinds: str, sqlstate: str,
                                                 message: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    with pytest.raises(psycopg.Error) as err:
        conn.execute(f"SELECT * FROM pgq.claim('w', kinds => {kinds})")
    assert err.value.sqlstate == sqlstate
    assert message in (err.value.diag.message_primary or "")
    assert job(conn, job_id)["state"] == "pending"


def test_concurrent_claimers_of_different_kinds_never_share_a_job(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue_many('q', 'a', array_fill('{}'::jsonb, ARRAY[300]))")
    conn.execute("SELECT pgq.enqueue_many('q', 'b', array_fill('{}'::jsonb, ARRAY[300]))")
    got: dict[str, list[tuple[int, str]]] = {}
    start = threading.Barrier(6)

    def claimer(name: str, kinds: list[str] | None) -> None:
        mine: list[tuple[int, str]] = []
        with psycopg.connect(dsn, autocommit=True) as c:
            start.wait()
            while batch := claim_kinds(c, kinds, ["q"], batch=7, worker=name):
                mine += batch
        got[name] = mine

    threads = [threading.Thread(target=claimer, args=(f"{k}{i}", kinds))
               for i in range(2) for k, kinds in (("a", ["a"]), ("b", ["b"]), ("any", None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [i for rows in got.values() for i, _ in rows]
    assert len(claimed) == len(set(claimed)) == 600
    for name, rows in got.items():
        if not name.startswith("any"):
            assert {k for _, k in rows} <= {name[0]}, name
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running' AND attempt = 1") == 600


# queue_status ---------------------------------------------------------------------------------------------

def test_queue_status_says_which_queues_exist_and_are_paused(connect, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue('emails', 'k')")
    conn.execute("SELECT pgq.configure_queue('sms')")
    conn.execute("SELECT pgq.pause('sms')")
    worker = connect(role="pgq_worker")
    rows = worker.execute("SELECT * FROM pgq.queue_status('{sms,emials,emails}')").fetchall()
    assert rows == [("sms", True, True), ("emials", False, False), ("emails", True, False)]
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE name = 'emials'") == 0


# health: a kind no running worker claims ----------------------------------------------------------------------

def test_health_reports_a_kind_whose_due_jobs_wait_while_workers_claim_the_queue_s_other_kinds(
        conn: psycopg.Connection) -> None:
    stuck = [one(conn, "SELECT pgq.enqueue('q', 'new_kind')") for _ in range(2)]
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '8 minutes' WHERE id = ANY(%s)", (stuck,))
    assert findings(conn)["unclaimed_kind"] == [("ok", "no kind waits much longer than the rest of its queue")]
    # Workers keep claiming the queue's other kind, and skip new_kind.
    for _ in range(3):
        conn.execute("SELECT pgq.enqueue('q', 'old_kind')")
        [(job_id, _kind)] = claim_kinds(conn, ["old_kind"], ["q"], batch=1)
        conn.execute("SELECT pgq.complete(%s, 1)", (job_id,))
    [(severity, detail)] = findings(conn)["unclaimed_kind"]
    assert severity == "critical"  # past max_ready_age (5 minutes)
    assert detail.startswith("queue q: 2 due job(s) of kind new_kind have waited up to 00:08:00")
    assert findings(conn, ready="12 minutes")["unclaimed_kind"][0][0] == "warning"  # past half of it
    hint = one(conn, "SELECT hint FROM pgq.health() WHERE \"check\" = 'unclaimed_kind'")
    assert hint.startswith("No running worker handles this kind")
    # Once a worker that handles it runs them, the finding goes away.
    for job_id, _kind in claim_kinds(conn, ["new_kind"], ["q"]):
        conn.execute("SELECT pgq.complete(%s, 1)", (job_id,))
    assert findings(conn)["unclaimed_kind"][0][0] == "ok"


def test_health_does_not_blame_a_kind_when_the_whole_queue_waits(conn: psycopg.Connection) -> None:
    # No worker at all: every kind waits alike. ready_age says so; unclaimed_kind does not.
    for kind in ("a", "b"):
        job_id = one(conn, "SELECT pgq.enqueue('q', %s)", (kind,))
        conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '8 minutes' WHERE id = %s", (job_id,))
    found = findings(conn)
    assert found["ready_age"][0][0] == "critical"
    assert found["unclaimed_kind"][0][0] == "ok"
    # A worker that claimed the other kind long before these came due does not count either.
    conn.execute("SELECT pgq.enqueue('q', 'c')")
    [(job_id, _kind)] = claim_kinds(conn, ["c"], ["q"], batch=1)
    conn.execute("UPDATE pgq.jobs SET claimed_at = now() - interval '1 hour' WHERE id = %s", (job_id,))
    assert findings(conn)["unclaimed_kind"][0][0] == "ok"
    assert claim(conn, queues=["q"], batch=10)  # (and a kinds => NULL claim takes them all)


def test_queue_settings_lists_every_queues_row_or_one_and_refuses_an_unknown_queue(conn: psycopg.Connection) -> None:
    from sqlfixtures import sqlstate_of

    one(conn, "SELECT pgq.enqueue('b', 'k')")
    one(conn, "SELECT pgq.enqueue('a', 'k')")
    conn.execute("SELECT pgq.configure_queue('b', fair => true, max_running => 2)")
    rows = conn.execute("SELECT name, fair, max_running, restricted FROM pgq.queue_settings()").fetchall()
    assert rows == [("a", False, 0, None), ("b", True, 2, None)]
    assert conn.execute("SELECT name FROM pgq.queue_settings('b')").fetchall() == [("b",)]
    assert sqlstate_of(conn, "SELECT * FROM pgq.queue_settings('nope')") == "22023"
