"""Issue 41, the registry of live workers (migration 0026, sql/functions/registry.sql).

pgq.worker_heartbeat announces and refreshes a worker of the caller's login, and removes it
(stopping); pgq.workers() lists the live ones, every login's for pgq_monitor and pgq_admin, a
worker's own login's otherwise; stale entries drop out of the list at once and out of the table
an hour later (the sweep). Isolation: entries are keyed by login, so a login never refreshes,
removes, reads or waits for another login's entry, whatever name it gives. pgq.queue_kinds and
pgq.health use it: the kinds of a queue's pending jobs that none of its live workers handles, and
the running jobs of a worker that stopped heartbeating, reported at once."""

from __future__ import annotations

import psycopg
import pytest

from loginkit import ALICE, BOSS, MALLORY, WATCH, Login
from sqlhelpers import claim, one


def beat(conn: psycopg.Connection, worker: str = "w1", **more: object) -> object:
    args = "".join(f", {k} => %({k})s" for k in more)
    return one(conn, f"SELECT pgq.worker_heartbeat(%(worker)s{args})", {"worker": worker, **more})


def listed(conn: psycopg.Connection) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute("SELECT worker, login FROM pgq.workers()").fetchall()]


def registry(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT login, worker, host, pid, queues, kinds, running FROM pgq.worker_registry"
                        " ORDER BY 1, 2").fetchall()


def findings(conn: psycopg.Connection, check: str) -> list[tuple[str, str]]:
    return [(r[0], r[2]) for r in conn.execute('SELECT * FROM pgq.health() WHERE "check" = %s', (check,))]


def test_a_heartbeat_announces_refreshes_and_the_last_one_removes_the_worker(
        conn: psycopg.Connection, login: Login) -> None:
    alice = login(ALICE)
    until = beat(alice, "w1", queues=["emails"], kinds=["send"], running=2, host="h1", pid=10,
                 alive_for="30 seconds")
    row = alice.execute("SELECT * FROM pgq.workers()").fetchone()
    assert row[:7] == ("w1", ALICE, "h1", 10, ["emails"], ["send"], 2)
    started, seen = row[7], row[8]
    assert row[9] == until and until > seen
    beat(alice, "w1", queues=["emails"], kinds=["send"], running=0, host="h1", pid=10)
    again = alice.execute("SELECT started_at, last_seen, running FROM pgq.workers()").fetchone()
    assert again[0] == started and again[1] >= seen and again[2] == 0
    # Another process under the same name: a new start.
    beat(alice, "w1", host="h1", pid=11)
    assert one(alice, "SELECT started_at FROM pgq.workers()") > started
    assert beat(alice, "w1", stopping=True) is None
    assert listed(alice) == [] and registry(conn) == []


def test_a_login_sees_its_own_workers_and_monitors_and_admins_see_every_logins(
        conn: psycopg.Connection, login: Login) -> None:
    alice, mallory = login(ALICE), login(MALLORY)
    beat(alice, "w1")
    beat(mallory, "w1")  # the same name: an entry of its own
    beat(mallory, "m2")
    assert listed(alice) == [("w1", ALICE)]
    assert listed(mallory) == [("m2", MALLORY), ("w1", MALLORY)]
    everyone = [("w1", ALICE), ("m2", MALLORY), ("w1", MALLORY)]
    assert listed(login(WATCH)) == everyone and listed(login(BOSS)) == everyone


def test_no_login_refreshes_removes_or_waits_for_another_logins_entry(
        conn: psycopg.Connection, login: Login) -> None:
    alice, mallory = login(ALICE), login(MALLORY, autocommit=False)
    beat(alice, "w1", host="alice-host")
    # Mallory holds his own entry of the same name, uncommitted: alice's heartbeat neither waits
    # for it (a wait would end only with mallory's commit, or fail after lock_timeout) nor sees it.
    beat(mallory, "w1", host="mallory-host")
    beat(alice, "w1", host="alice-host", running=3)
    # His farewell under her worker's name removes his entry only.
    beat(mallory, "w1", stopping=True)
    mallory.commit()
    assert registry(conn) == [(ALICE, "w1", "alice-host", None, None, None, 3)]


def test_a_stale_entry_leaves_the_list_at_once_and_the_table_an_hour_later(
        conn: psycopg.Connection, login: Login) -> None:
    alice = login(ALICE)
    beat(alice, "gone")
    beat(alice, "recent")
    beat(alice, "alive")
    conn.execute("UPDATE pgq.worker_registry SET alive_until = now() - interval '61 minutes' WHERE worker = 'gone'")
    conn.execute("UPDATE pgq.worker_registry SET alive_until = now() - interval '1 minute' WHERE worker = 'recent'")
    assert listed(alice) == [("alive", ALICE)]
    one(alice, "SELECT pgq.sweep()")
    assert [r[1] for r in registry(conn)] == ["alive", "recent"]


def test_a_login_has_at_most_10000_entries(conn: psycopg.Connection, login: Login) -> None:
    conn.execute("INSERT INTO pgq.worker_registry (login, worker, started_at, last_seen, alive_until)"
                 " SELECT %s, 'w' || i, now(), now(), now() - interval '2 hours' FROM generate_series(1, 10000) AS i",
                 (ALICE,))
    alice = login(ALICE)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded) as info:
        beat(alice, "one-more")
    assert "10000 entries" in str(info.value)
    beat(alice, "w1")  # an existing entry is refreshed
    beat(login(MALLORY), "w1")  # another login is not limited by alice's entries


@pytest.mark.parametrize("args,sqlstate,argument", [
    ("NULL", "22004", "worker"),
    ("''", "22023", "worker"),
    ("'w', '{}'", "22023", "queues"),
    ("'w', ARRAY['a b']", "22023", "queues[1]"),
    ("'w', kinds => ARRAY['k', NULL]", "22023", "kinds"),
    ("'w', running => NULL", "22004", "running"),
    ("'w', running => -1", "22023", "running"),
    ("'w', host => ''", "22023", "host"),
    ("'w', pid => -1", "22023", "pid"),
    ("'w', alive_for => NULL", "22004", "alive_for"),
    ("'w', alive_for => '0.5 seconds'", "22023", "alive_for"),
    ("'w', alive_for => '2 days'", "22023", "alive_for"),
    ("'w', alive_for => '1 month'", "22023", "alive_for"),
    ("'w', stopping => NULL", "22004", "stopping"),
])
def test_a_bad_argument_names_itself_and_writes_nothing(conn: psycopg.Connection, login: Login, args: str,
                                                        sqlstate: str, argument: str) -> None:
    alice = login(ALICE)
    with pytest.raises(psycopg.Error) as info:
        alice.execute(f"SELECT pgq.worker_heartbeat({args})")
    assert info.value.sqlstate == sqlstate
    assert f'argument "{argument}"' in (info.value.diag.message_primary or "")
    assert registry(conn) == []


def test_queue_kinds_tells_which_pending_kinds_a_live_worker_handles(conn: psycopg.Connection, login: Login) -> None:
    for kind in ("send", "send", "typo", "report"):
        one(conn, "SELECT pgq.enqueue('emails', %s)", (kind,))
    one(conn, "SELECT pgq.enqueue('emails', 'later', run_at => now() + interval '1 day')")
    one(conn, "SELECT pgq.enqueue('other', 'x')")
    alice = login(ALICE)
    kinds = "SELECT queue, kind, handled FROM pgq.queue_kinds(ARRAY['emails'])"
    assert alice.execute(kinds).fetchall() == [("emails", k, False) for k in ("later", "report", "send", "typo")]
    beat(alice, "w1", queues=["emails"], kinds=["send", "later"])
    beat(login(MALLORY), "m1", kinds=["report"])  # all queues
    assert alice.execute(kinds).fetchall() == [
        ("emails", "later", True), ("emails", "report", True), ("emails", "send", True), ("emails", "typo", False)]
    assert ("other", "x", False) in alice.execute("SELECT * FROM pgq.queue_kinds()").fetchall()


def test_queue_kinds_leaves_out_a_queue_the_login_may_not_read(conn: psycopg.Connection, login: Login) -> None:
    one(conn, "SELECT pgq.enqueue('secret', 'k')")
    one(conn, "SELECT pgq.grant_queue('secret', 'pgq_t_claimers', 'claim')")
    assert login(ALICE).execute("SELECT * FROM pgq.queue_kinds()").fetchall() == []


def test_health_names_a_kind_no_live_worker_of_its_queue_handles_at_once(
        conn: psycopg.Connection, login: Login) -> None:
    one(conn, "SELECT pgq.enqueue('emails', 'send_welcom')")
    assert findings(conn, "unhandled_kinds")[0][0] == "ok"  # no live worker: nothing to say yet
    beat(login(ALICE), "w1", queues=["emails"], kinds=["send_welcome"])
    assert findings(conn, "unhandled_kinds") == [
        ("warning", "queue emails: pending jobs of kind send_welcom, which none of its 1 live worker(s) handles")]
    beat(login(MALLORY), "m1", queues=["emails"], kinds=["send_welcom"])
    assert findings(conn, "unhandled_kinds")[0][0] == "ok"


def test_health_names_the_running_jobs_of_a_worker_that_stopped_heartbeating(
        conn: psycopg.Connection, login: Login) -> None:
    alice = login(ALICE)
    ids = [one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(2)]
    beat(alice, "w1", host="h1", pid=7)
    assert sorted(c["id"] for c in claim(alice, worker="w1", queues=["q"], batch=2)) == ids
    assert findings(conn, "silent_workers")[0][0] == "ok"
    conn.execute("UPDATE pgq.worker_registry SET alive_until = now() - interval '90 seconds'")
    ((severity, detail),) = findings(conn, "silent_workers")
    assert severity == "warning"
    assert detail.startswith(f"worker w1 (login {ALICE}, h1 pid 7) stopped heartbeating 00:01:3")
    assert detail.endswith(f"holds 2 running job(s): {ids[0]}, {ids[1]}")
