"""Issue 18, through real logins: a job is bound to the login that claimed it, per-queue grants
restrict enqueue, claim and read, and pgq.health shows other sessions' SQL only to whoever could
read it in pg_stat_activity. Every hostile call here is made by a LOGIN role of its own (SET ROLE
would keep session_user, the superuser, who may do anything)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from loginkit import ALICE, BOSS, CLAIMERS, MALLORY, PROD, PROD2, READERS, STATS_WATCH, WATCH, WRITERS
from sqlfixtures import sqlstate_of
from sqlhelpers import claim, job, one


def rejected(su: psycopg.Connection, job_id: int) -> list[tuple[str, str]]:
    """(session_role, note) of the job's rejected events, oldest first."""
    return [(r[0], r[1]) for r in su.execute(
        "SELECT session_role, note FROM pgq.job_events WHERE job_id = %s AND event = 'rejected' ORDER BY id",
        (job_id,))]


# Workers act only on their own jobs --------------------------------------------------------------

def test_a_forged_complete_by_another_login_is_refused_and_the_owner_still_completes(conn, login):
    """The issue's reproduction: mallory completes alice's job with a forged result by guessing
    attempt 1; alice's complete then answered true too, so nobody noticed."""
    job_id = one(conn, "SELECT pgq.enqueue('q', 'pay', '{\"card\": \"x\"}')")
    alice, mallory = login(ALICE), login(MALLORY)
    [claimed] = claim(alice, worker="alice-1")
    assert claimed["attempt"] == 1

    assert one(mallory, "SELECT pgq.complete(%s, 1, '{\"forged\": true}')", (job_id,)) is False
    assert job(conn, job_id)["state"] == "running"
    assert job(conn, job_id)["result"] is None
    [(who, note)] = rejected(conn, job_id)
    assert who == MALLORY
    assert note.startswith("complete from attempt 1 rejected") and f"login {ALICE}" in note

    assert one(alice, "SELECT pgq.complete(%s, 1, '{\"paid\": true}')", (job_id,)) is True
    assert one(alice, "SELECT pgq.complete(%s, 1, '{\"paid\": true}')", (job_id,)) is True  # the repeat
    assert one(mallory, "SELECT pgq.complete(%s, 1)", (job_id,)) is False  # not for another login
    row = job(conn, job_id)
    assert (row["state"], row["result"], row["session_role"]) == ("done", {"paid": True}, ALICE)
    assert [w for w, _ in rejected(conn, job_id)] == [MALLORY, MALLORY]


def test_repeated_rejections_are_counted_per_login(conn, login):
    """0009 records a repeated rejection once, with a count (times); the key includes the login
    that made the call, so one login's flood cannot hide another's forged calls in its count."""
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    claim(conn, worker="owner")  # attempt 1, owned by the superuser's login
    alice, mallory = login(ALICE), login(MALLORY)
    for _ in range(3):
        assert one(mallory, "SELECT pgq.complete(%s, 1)", (job_id,)) is False
    for _ in range(2):
        assert one(alice, "SELECT pgq.complete(%s, 1)", (job_id,)) is False
    assert one(mallory, "SELECT pgq.complete(%s, 1)", (job_id,)) is False
    counted = conn.execute(
        "SELECT session_role, attempt, times FROM pgq.job_events"
        " WHERE job_id = %s AND event = 'rejected' ORDER BY id", (job_id,)).fetchall()
    assert counted == [(MALLORY, 1, 4), (ALICE, 1, 2)]
    assert job(conn, job_id)["state"] == "running"


OWNER_OPS: dict[str, tuple[str, Any]] = {
    "renew": ("SELECT pgq.renew(%s, 1)", None),
    "complete": ("SELECT pgq.complete(%s, 1)", False),
    "fail": ("SELECT pgq.fail(%s, 1, 'forged')", None),
    "release": ("SELECT pgq.release(%s, 1)", False),
    "snooze": ("SELECT pgq.snooze(%s, 1, '1 hour')", None),
    "mark_unknown": ("SELECT pgq.mark_unknown(%s, 1, 'forged')", False),
    "progress": ("SELECT pgq.progress(%s, 1, '{\"forged\": true}')", False),
    "complete_many": ("SELECT coalesce(array_agg(x), '{}') FROM pgq.complete_many(ARRAY[%s]::bigint[], '{1}') AS x",
                      []),
    "complete_and_claim": ("SELECT completed FROM pgq.complete_and_claim(ARRAY[%s]::bigint[], '{1}', 'mallory-1')",
                           []),
}


@pytest.mark.parametrize("op", sorted(OWNER_OPS))
def test_every_owner_operation_from_another_login_is_not_yours_and_leaves_a_rejected_event(conn, login, op):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    alice, mallory = login(ALICE), login(MALLORY)
    claim(alice, worker="alice-1")
    before = job(conn, job_id)
    sql, not_yours = OWNER_OPS[op]
    assert one(mallory, sql, (job_id,)) == not_yours
    assert job(conn, job_id) == before, f"{op} by another login changed the job"
    [(who, note)] = rejected(conn, job_id)
    noted = "complete_many" if op == "complete_and_claim" else op  # (its completions are complete_many's)
    assert who == MALLORY and note.startswith(f"{noted} from attempt 1 rejected"), note
    # The owner's own call still works afterwards.
    assert one(alice, sql, (job_id,)) not in (None, False, [])


def test_a_member_of_pgq_admin_may_act_on_any_job_and_then_it_is_no_longer_the_claimers(conn, login):
    a, b = (one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(2))
    alice, boss = login(ALICE), login(BOSS)
    claim(alice, worker="alice-1", batch=2)
    assert one(boss, "SELECT pgq.renew(%s, 1, '5 minutes') IS NOT NULL", (a,)) is True
    assert job(conn, a)["session_role"] == ALICE  # a renew keeps the owner
    assert one(alice, "SELECT pgq.renew(%s, 1) IS NOT NULL", (a,)) is True
    assert one(boss, "SELECT pgq.complete(%s, 1, '{\"by\": \"boss\"}')", (a,)) is True
    assert one(boss, "SELECT pgq.complete(%s, 1)", (a,)) is True  # the admin's own repeat
    assert one(alice, "SELECT pgq.complete(%s, 1)", (a,)) is False  # alice did not complete it
    assert job(conn, a)["result"] == {"by": "boss"}
    assert one(boss, "SELECT pgq.fail(%s, 1, 'boss says no', retryable => false)", (b,)) == "failed"
    assert one(alice, "SELECT pgq.fail(%s, 1, 'mine', retryable => false)", (b,)) is None
    assert job(conn, b)["last_error"] == "boss says no"


@pytest.mark.parametrize("op, sql, first", [
    ("fail", "SELECT pgq.fail(%s, 1, 'e', retryable => false)", "failed"),
    ("release", "SELECT pgq.release(%s, 1)", True),
    ("mark_unknown", "SELECT pgq.mark_unknown(%s, 1, 'n')", True),
])
def test_the_repeat_call_answers_as_the_first_one_only_for_the_login_that_made_it(conn, login, op, sql, first):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    alice, mallory = login(ALICE), login(MALLORY)
    claim(alice)
    assert one(alice, sql, (job_id,)) == first
    assert one(alice, sql, (job_id,)) == first
    assert one(mallory, sql, (job_id,)) in (None, False)
    assert [w for w, _ in rejected(conn, job_id)] == [MALLORY]


def test_a_repeated_snooze_and_complete_many_are_recognised_only_for_their_login(conn, login):
    a, b = (one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(2))
    alice, mallory = login(ALICE), login(MALLORY)
    claim(alice, batch=2)
    until = one(alice, "SELECT pgq.snooze(%s, 1, '1 hour')", (a,))
    assert one(alice, "SELECT pgq.snooze(%s, 1, '1 hour')", (a,)) == until
    assert one(mallory, "SELECT pgq.snooze(%s, 1, '1 hour')", (a,)) is None
    many = "SELECT coalesce(array_agg(x), '{}') FROM pgq.complete_many(ARRAY[%s]::bigint[], '{1}') AS x"
    assert one(alice, many, (b,)) == [b]
    assert one(alice, many, (b,)) == [b]
    assert one(mallory, many, (b,)) == []
    assert [w for w, _ in rejected(conn, b)] == [MALLORY]


def test_job_history_names_the_login_of_every_event(conn, login):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    alice, mallory, watch = login(ALICE), login(MALLORY), login(WATCH)
    producer = login(PROD)
    job2 = one(producer, "SELECT pgq.enqueue('q', 'k')")
    claim(alice, worker="w-1")
    one(mallory, "SELECT pgq.complete(%s, 1)", (job_id,))
    one(alice, "SELECT pgq.complete(%s, 1)", (job_id,))
    cur = watch.execute("SELECT event, worker, session_role FROM pgq.job_history(%s)", (job_id,))
    assert [d.name for d in cur.description][-1] == "session_role"
    assert cur.fetchall() == [("claimed", "w-1", ALICE), ("rejected", None, MALLORY), ("completed", "w-1", ALICE)]
    assert job2 > job_id


def test_two_logins_racing_complete_on_the_same_jobs_the_owner_always_wins(conn, login):
    jobs = [r[0] for r in conn.execute(
        "SELECT * FROM pgq.enqueue_many('race', 'k', array_fill('{}'::jsonb, ARRAY[150]))")]
    alice_claim = login(ALICE)
    claimed = claim(alice_claim, queues=["race"], batch=150)
    assert len(claimed) == 150
    answers: dict[str, list[bool]] = {ALICE: [], MALLORY: []}
    start = threading.Barrier(2)

    def run(name: str) -> None:
        c = login(name)
        start.wait()
        for job_id in jobs:
            answers[name].append(one(c, "SELECT pgq.complete(%s, 1, %s)", (job_id, f'{{"by": "{name}"}}')))

    threads = [threading.Thread(target=run, args=(n,)) for n in (ALICE, MALLORY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers[ALICE] == [True] * 150
    assert answers[MALLORY] == [False] * 150
    rows = conn.execute("SELECT state, result, session_role, count(*) FROM pgq.jobs WHERE queue = 'race' "
                        "GROUP BY 1, 2, 3").fetchall()
    assert rows == [("done", {"by": ALICE}, ALICE, 150)]
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'rejected' AND session_role = %s",
               (MALLORY,)) == 150


# Per-queue grants --------------------------------------------------------------------------------

def test_grant_queue_refuses_bad_arguments_naming_them_and_changes_nothing(conn, login):
    one(conn, "SELECT pgq.enqueue('secret', 'k')")
    boss = login(BOSS)
    cases = [
        ("SELECT pgq.grant_queue('secret', %s, 'delete')", (WRITERS,), "22023", "privilege"),
        ("SELECT pgq.grant_queue('secret', %s, NULL)", (WRITERS,), "22004", "privilege"),
        ("SELECT pgq.grant_queue('secret', 'pgq_t_no_such_role', 'enqueue')", None, "22023", "role"),
        ("SELECT pgq.grant_queue('secret', 'public', 'enqueue')", None, "22023", "role"),
        ("SELECT pgq.grant_queue('secret', NULL, 'enqueue')", None, "22004", "role"),
        ("SELECT pgq.grant_queue('no_such_queue', %s, 'enqueue')", (WRITERS,), "22023", "queue"),
        ("SELECT pgq.grant_queue('bad name', %s, 'enqueue')", (WRITERS,), "22023", "queue"),
        ("SELECT pgq.grant_queue(NULL, %s, 'enqueue')", (WRITERS,), "22004", "queue"),
        ("SELECT pgq.revoke_queue('secret', %s, 'everything')", (WRITERS,), "22023", "privilege"),
        ("SELECT pgq.revoke_queue('secret', 'pgq_t_no_such_role', 'claim')", None, "22023", "role"),
        ("SELECT pgq.revoke_queue('nope', %s, 'claim')", (WRITERS,), "22023", "queue"),
    ]
    for sql, params, state, argument in cases:
        with pytest.raises(psycopg.Error) as e:
            boss.execute(sql, params)
        assert e.value.sqlstate == state, sql
        assert f'argument "{argument}"' in str(e.value), (sql, str(e.value))
    assert one(conn, "SELECT count(*) FROM pgq.grants") == 0
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE restricted IS NOT NULL") == 0
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 1


def test_enqueue_into_a_queue_with_enqueue_grants_is_for_the_granted_roles_only(conn, login):
    boss, prod, prod2 = login(BOSS), login(PROD), login(PROD2)
    one(boss, "SELECT pgq.configure_queue('secret')")
    assert one(boss, "SELECT pgq.grant_queue('secret', %s, 'enqueue')", (WRITERS,)) is True
    assert one(boss, "SELECT pgq.grant_queue('secret', %s, 'enqueue')", (WRITERS,)) is False  # already there
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        prod.execute("SELECT pgq.enqueue('secret', 'k')")
    assert "secret" in str(e.value) and PROD in str(e.value) and e.value.diag.message_hint
    assert sqlstate_of(prod, "SELECT pgq.enqueue_many('secret', 'k', ARRAY['{}']::jsonb[])") == "42501"
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0
    assert one(prod2, "SELECT pgq.enqueue('secret', 'k')") >= 1  # a member of the granted group
    assert len(prod2.execute("SELECT pgq.enqueue_many('secret', 'k', ARRAY['{}', '{}']::jsonb[])").fetchall()) == 2
    assert one(boss, "SELECT pgq.enqueue('secret', 'k')") >= 1  # pgq_admin
    assert one(prod, "SELECT pgq.enqueue('open', 'k')") >= 1  # other queues stay open
    # enqueue grants restrict only enqueue: every worker may still claim.
    assert len(claim(login(MALLORY), queues=["secret"], batch=10)) == 4


def test_claim_of_a_queue_with_claim_grants_raises_when_named_and_skips_it_otherwise(conn, login):
    boss, alice, mallory = login(BOSS), login(ALICE), login(MALLORY)
    for queue in ("secret", "open"):
        one(conn, "SELECT pgq.enqueue(%s, 'k')", (queue,))
    conn.execute(f"GRANT {CLAIMERS} TO {ALICE}")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'claim')", (CLAIMERS,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        claim(mallory, queues=["secret"])
    assert "claim from queue 'secret'" in str(e.value)
    assert sqlstate_of(mallory, "SELECT * FROM pgq.claim('m', '{open,secret}')") == "42501"
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 0
    got = claim(mallory, batch=10)  # all queues: the restricted one is skipped silently
    assert [j["queue"] for j in got] == ["open"]
    assert claim(mallory, batch=10) == []
    assert [j["queue"] for j in claim(alice, queues=["secret"])] == ["secret"]
    # A capped queue (its row locked by the claim) is filtered the same way.
    one(boss, "SELECT pgq.configure_queue('secret', max_running => 5)")
    one(conn, "SELECT pgq.enqueue('secret', 'k')")
    assert claim(mallory, batch=10) == []
    assert sqlstate_of(mallory, "SELECT * FROM pgq.claim('m', '{secret}')") == "42501"
    assert [j["queue"] for j in claim(alice, batch=10)] == ["secret"]


def test_read_grants_hide_a_queues_jobs_from_other_monitors_but_not_its_counts(conn, login):
    boss, watch, alice = login(BOSS), login(WATCH), login(ALICE)
    secret = one(conn, "SELECT pgq.enqueue('secret', 'k', '{\"card\": \"4111\"}')")
    public = one(conn, "SELECT pgq.enqueue('open', 'k')")
    claim(alice, queues=["secret"])
    one(conn, "SELECT pgq.enqueue('secret', 'k')")  # a pending one too
    one(boss, "SELECT pgq.schedule('nightly', 'secret', 'k', every => '1 day', payload => '{\"card\": 1}')")
    one(boss, "SELECT pgq.schedule('hourly', 'open', 'k', every => '1 hour')")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))

    assert sqlstate_of(watch, "SELECT * FROM pgq.get_job(%s)", (secret,)) == "P0002"  # as if there were none
    assert watch.execute("SELECT * FROM pgq.job_history(%s)", (secret,)).fetchall() == []
    assert [r[0] for r in watch.execute("SELECT id FROM pgq.list_jobs()")] == [public]
    assert [r[0] for r in watch.execute("SELECT id FROM pgq.list_jobs(state => 'running')")] == []
    assert sqlstate_of(watch, "SELECT * FROM pgq.list_jobs('secret')") == "42501"
    stats = {r[0]: r for r in watch.execute("SELECT queue, pending, running FROM pgq.stats()")}
    assert stats["secret"][1:] == (1, 1)  # stats keeps its counts
    assert one(watch, "SELECT (pgq.get_job(%s)).id", (public,)) == public
    assert [r[0] for r in watch.execute("SELECT name FROM pgq.schedules()")] == ["hourly"]
    assert [r[0] for r in boss.execute("SELECT name FROM pgq.schedules()")] == ["hourly", "nightly"]

    # A member of the read group, a holder of a claim grant, and pgq_admin read it.
    conn.execute(f"GRANT {READERS} TO {WATCH}")
    assert one(watch, "SELECT (pgq.get_job(%s)).payload", (secret,)) == {"card": "4111"}
    assert len(watch.execute("SELECT * FROM pgq.list_jobs()").fetchall()) == 3
    conn.execute(f"REVOKE {READERS} FROM {WATCH}")
    conn.execute(f"GRANT {CLAIMERS} TO {WATCH}")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'claim')", (CLAIMERS,))
    assert len(watch.execute("SELECT * FROM pgq.job_history(%s)", (secret,)).fetchall()) == 1
    assert len(boss.execute("SELECT * FROM pgq.list_jobs('secret')").fetchall()) == 2
    conn.execute(f"REVOKE {CLAIMERS} FROM {WATCH}")


def test_revoking_the_last_grant_opens_the_queue_again_and_queue_grants_lists_them(conn, login):
    boss, prod, watch = login(BOSS), login(PROD), login(WATCH)
    one(boss, "SELECT pgq.configure_queue('secret')")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'enqueue')", (WRITERS,))
    one(boss, "SELECT pgq.grant_queue('secret', 'pgq_admin', 'enqueue')")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    rows = watch.execute("SELECT queue, privilege, role, granted_by FROM pgq.queue_grants()").fetchall()
    assert rows == [("secret", "enqueue", "pgq_admin", BOSS), ("secret", "enqueue", WRITERS, BOSS),
                    ("secret", "read", READERS, BOSS)]
    assert one(conn, "SELECT restricted FROM pgq.queues WHERE name = 'secret'") == ["enqueue", "read"]
    assert sqlstate_of(watch, "SELECT * FROM pgq.queue_grants('nope')") == "22023"

    assert one(boss, "SELECT pgq.revoke_queue('secret', %s, 'enqueue')", (WRITERS,)) is True
    assert one(boss, "SELECT pgq.revoke_queue('secret', %s, 'enqueue')", (WRITERS,)) is False
    assert sqlstate_of(prod, "SELECT pgq.enqueue('secret', 'k')") == "42501"  # pgq_admin's grant remains
    notices: list[str] = []
    boss.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    assert one(boss, "SELECT pgq.revoke_queue('secret', 'pgq_admin', 'enqueue')") is True
    assert any("no enqueue grant left" in n for n in notices), notices
    assert one(conn, "SELECT restricted FROM pgq.queues WHERE name = 'secret'") == ["read"]
    assert one(prod, "SELECT pgq.enqueue('secret', 'k')") >= 1


def test_a_grant_of_a_dropped_role_matches_nobody_and_is_revoked_by_its_oid(conn, login):
    boss, prod = login(BOSS), login(PROD)
    conn.execute("DROP ROLE IF EXISTS pgq_t_gone")
    conn.execute("CREATE ROLE pgq_t_gone NOLOGIN")
    conn.execute(f"GRANT pgq_t_gone TO {PROD}")
    one(boss, "SELECT pgq.configure_queue('secret')")
    one(boss, "SELECT pgq.grant_queue('secret', 'pgq_t_gone', 'enqueue')")
    assert one(prod, "SELECT pgq.enqueue('secret', 'k')") >= 1
    oid = one(conn, "SELECT 'pgq_t_gone'::regrole::oid::text")
    conn.execute("DROP ROLE pgq_t_gone")
    assert sqlstate_of(prod, "SELECT pgq.enqueue('secret', 'k')") == "42501"  # still restricted
    assert one(boss, "SELECT role FROM pgq.queue_grants('secret')") == oid
    assert one(boss, "SELECT pgq.revoke_queue('secret', %s, 'enqueue')", (oid,)) is True
    assert one(prod, "SELECT pgq.enqueue('secret', 'k')") >= 1


def test_a_revoke_during_claims_holds_from_its_commit_on(conn, login):
    """Claimers of a login loop on a restricted queue while an admin revokes the login's grant
    (pgq_admin's grant keeps the queue restricted): every claim that starts after the revoke's
    commit is refused, and no job is claimed twice."""
    boss = login(BOSS)
    conn.execute(f"GRANT {CLAIMERS} TO {ALICE}")
    one(boss, "SELECT pgq.configure_queue('secret')")
    conn.execute("SELECT pgq.enqueue_many('secret', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
    one(boss, "SELECT pgq.grant_queue('secret', %s, 'claim')", (CLAIMERS,))
    one(boss, "SELECT pgq.grant_queue('secret', 'pgq_admin', 'claim')")
    revoked = threading.Event()
    stop = threading.Event()
    late_successes: list[int] = []
    refused_after: list[int] = []
    claimed_ids: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        c = login(ALICE)
        while not stop.is_set():
            after = revoked.is_set()
            try:
                got = [r["id"] for r in claim(c, queues=["secret"], batch=5)]
            except psycopg.errors.InsufficientPrivilege:
                if after:
                    with lock:
                        refused_after.append(1)
                continue
            with lock:
                claimed_ids.extend(got)
                if after and got:
                    late_successes.extend(got)
            for job_id in got:
                one(c, "SELECT pgq.complete(%s, 1)", (job_id,))

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(claimed_ids) < 50 and time.monotonic() < deadline:  # the claimers are claiming
        time.sleep(0.01)
    one(boss, "SELECT pgq.revoke_queue('secret', %s, 'claim')", (CLAIMERS,))
    revoked.set()
    while len(refused_after) < 30 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    conn.execute(f"REVOKE {CLAIMERS} FROM {ALICE}")
    assert len(claimed_ids) >= 50 and len(refused_after) >= 30
    assert late_successes == []
    assert len(claimed_ids) == len(set(claimed_ids))
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == len(claimed_ids)


# The monitor role sees queue state, not other people's SQL ----------------------------------------

def test_health_shows_another_roles_sql_only_to_who_may_read_it_in_pg_stat_activity(conn, login):
    holder = login(ALICE, autocommit=False)
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    pid = one(holder, "SELECT pg_backend_pid()")
    holder.execute("SELECT 'card 4111-1111-1111-1111' /* secret */")  # holds a snapshot, idle in transaction
    time.sleep(0.05)  # the snapshot must be older than max_snapshot_age / 2 (1 ms)

    def snapshot_findings(c: psycopg.Connection) -> list[str]:
        return [r[0] for r in c.execute("SELECT detail FROM pgq.health(max_snapshot_age => '2 ms') "
                                        "WHERE \"check\" IN ('idle_in_transaction', 'long_transaction')")
                if f"pid {pid} " in r[0]]

    [as_monitor] = snapshot_findings(login(WATCH))
    assert "4111" not in as_monitor and "secret" not in as_monitor
    assert ALICE in as_monitor and "idle in transaction" in as_monitor  # pid, role, state, duration stay
    [as_stats_reader] = snapshot_findings(login(STATS_WATCH))  # pg_read_all_stats may read it anyway
    assert "4111" in as_stats_reader
    [as_superuser] = snapshot_findings(conn)
    assert "4111" in as_superuser
    holder.rollback()


def test_health_hides_a_blocked_sessions_sql_from_a_monitor_of_another_role(conn, login):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    locker = login(ALICE, autocommit=False)
    locker.execute("SELECT pgq.claim('w', '{q}')")  # holds the job's row lock until rollback
    boss = login(BOSS)
    waiter = threading.Thread(target=lambda: boss.execute("SELECT pgq.cancel(%s) /* token s3cr3t */", (job_id,)))
    waiter.start()
    watch, stats_watch = login(WATCH), login(STATS_WATCH)
    try:
        deadline = time.monotonic() + 10
        shown: list[str] = []
        while not shown and time.monotonic() < deadline:
            shown = [r[0] for r in watch.execute("SELECT detail FROM pgq.health() WHERE \"check\" = 'blocked_sessions'")
                     if "has waited" in r[0]]
            time.sleep(0.02)
        [detail] = shown
        assert f"pid {boss.info.backend_pid} has waited" in detail and f"role {BOSS}" in detail
        assert "s3cr3t" not in detail and "query not shown" in detail
        [seen] = [r[0] for r in stats_watch.execute(
            "SELECT detail FROM pgq.health() WHERE \"check\" = 'blocked_sessions'") if "has waited" in r[0]]
        assert "s3cr3t" in seen
    finally:
        locker.rollback()
        waiter.join(timeout=10)


# No later function gets PUBLIC EXECUTE ------------------------------------------------------------

LATER = """
CREATE FUNCTION pgq.later_feature() RETURNS text
    LANGUAGE sql SECURITY DEFINER SET search_path = pgq, pg_temp
    AS $$ SELECT 'reached' $$;
"""


def _apply(directory: Path, dsn: str) -> None:
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import yoyo_url

    backend = get_backend(yoyo_url(dsn))
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(str(directory))))
    finally:
        backend.connection.close()


@pytest.mark.parametrize("hook", [False, True])
def test_a_function_a_later_migration_creates_does_not_survive_the_apply(
        empty_dsn, tmp_path, conn, login, hook):
    """A later migration creates a function (which only sql/functions/ may do): applied with yoyo
    as `yoyo apply` does, the post-apply hook installs the function source, whose last step drops
    every pgq function the source does not define, so no role can ever call it. Without the hook
    (hook=False: yoyo alone, what PostgreSQL does by itself) it stays, and PUBLIC may execute it."""
    from pgq_thin.migrate import migrations_dir
    from pgq_thin.sqlsource import source_dir

    shutil.copytree(migrations_dir(), tmp_path / "m")
    (tmp_path / "sql").mkdir()  # the hook reads the function source beside the migrations
    shutil.copy(source_dir().parent / "all_functions.sql", tmp_path / "sql" / "all_functions.sql")
    if not hook:
        (tmp_path / "m" / "post-apply.py").unlink()
    (tmp_path / "m" / "0099_later_feature.sql").write_text(LATER)
    _apply(tmp_path / "m", empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as su:
        exists = one(su, "SELECT to_regprocedure('pgq.later_feature()') IS NOT NULL")
        assert exists is (not hook)
        assert one(su, "SELECT to_regprocedure('pgq.claim(text, text[], integer, interval, text[])') IS NOT NULL")
        if not hook:
            for role in ("pgq_worker", "pgq_producer", "pgq_monitor"):
                assert one(su, "SELECT has_function_privilege(%s, 'pgq.later_feature()', 'EXECUTE')", (role,))
    login(MALLORY)  # makes the login roles
    with psycopg.connect(make_conninfo(empty_dsn, user=MALLORY), autocommit=True) as mallory:
        assert sqlstate_of(mallory, "SELECT pgq.later_feature()") == (None if not hook else "42883")