"""Deterministic interleavings (TESTING.md scenarios 1-11) on the lab's multi-session harness.

Named sessions run named steps in the order each test writes them; a step is "blocked" when the
harness sees it in pg_blocking_pids(). Scenarios 4-6 need a statement paused *after* it took its
snapshot and *before* it locks a row. They get it from a gated clock: in the test database (as
superuser) pgq._now() is replaced by a function that, in a session that SET pgq_test.gate = 'on',
waits on an advisory lock the test holds. The claim and the sweep read the clock in the filter of
the very scan whose rows they then lock, so the gate stops them exactly between snapshot and lock.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from pgq_tools.lab.harness import Harness, Step

from sqlhelpers import GATE_KEY, events, expire_lease, install_gated_clock, job, one

DEADLINE = 30.0
CLAIM = "SELECT id, attempt FROM pgq.claim(worker => %(w)s, queues => ARRAY['q'], batch => %(batch)s)"


@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="interleavings", step_timeout=10)
    yield harness
    harness.close()


def enqueue(conn: psycopg.Connection, n: int = 1, **more: object) -> list[int]:
    extra = "".join(f", {k} => %({k})s" for k in more)
    return [int(one(conn, f"SELECT pgq.enqueue('q', 'k', jsonb_build_object('n', %(n)s){extra})",
                    {"n": i, **more})) for i in range(n)]


def claim_ids(step: Step) -> list[int]:
    assert step.ok, step.outcome
    return [r[0] for r in step.rows]


# 1 ------------------------------------------------------------------------------------------------

def _interleavings(a: list[str], b: list[str]) -> list[tuple[str, ...]]:
    out = []
    for positions in itertools.combinations(range(len(a) + len(b)), len(a)):
        ia, ib, seq = iter(a), iter(b), []
        for i in range(len(a) + len(b)):
            seq.append(next(ia) if i in positions else next(ib))
        out.append(tuple(seq))
    return out


PERMUTATIONS = _interleavings(["a_claim1", "a_claim2", "a_commit"], ["b_claim1", "b_claim2", "b_commit"])


def test_two_sessions_claiming_at_once_never_get_the_same_job_in_any_permutation(
        dsn: str, conn: psycopg.Connection) -> None:
    assert len(PERMUTATIONS) == 20
    for permutation in PERMUTATIONS:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.job_dependants RESTART IDENTITY")
        with Harness(dsn, experiment=" ".join(permutation), step_timeout=10) as h:
            _claim_permutation(h, conn, permutation)


def _claim_permutation(h: Harness, conn: psycopg.Connection, permutation: tuple[str, ...]) -> None:
    where = " ".join(permutation)
    ids = enqueue(conn, 3)
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    h.step(b, "b_begin", "BEGIN")
    got: dict[str, list[int]] = {"a": [], "b": []}
    for name in permutation:
        session = name[0]
        if name.endswith("commit"):
            step = h.step(session, name, "COMMIT")
        else:
            step = h.step(session, name, CLAIM, {"w": session, "batch": 1})
            got[session] += claim_ids(step)
        assert step.ok and not step.blocked, f"{where}: {name}: {step.outcome} (a claim must never wait)"
    assert not set(got["a"]) & set(got["b"]), f"{where}: {got}"
    assert len(got["a"]) == len(set(got["a"])) and len(got["b"]) == len(set(got["b"])), f"{where}: {got}"
    # Three jobs, four claims: exactly three succeed, whatever the order.
    assert sorted(got["a"] + got["b"]) == ids, f"{where}: {got}"
    rows = conn.execute("SELECT id, claimed_by, attempt FROM pgq.jobs ORDER BY id").fetchall()
    owner = {i: s for s in got for i in got[s]}
    assert rows == [(i, owner[i], 1) for i in ids], where


# 2 ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lock", ["fk_insert", "for_key_share"])
def test_a_key_share_lock_on_a_job_does_not_hide_it_from_claim(
        h: Harness, conn: psycopg.Connection, lock: str) -> None:
    conn.execute("CREATE TABLE public.receipts (job_id bigint NOT NULL REFERENCES pgq.jobs (id))")
    first, second = enqueue(conn, 2)
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    if lock == "fk_insert":
        held = h.step(a, "a_child", "INSERT INTO public.receipts VALUES (%s)", (first,))
    else:
        held = h.step(a, "a_key_share", "SELECT id FROM pgq.jobs WHERE id = %s FOR KEY SHARE", (first,))
    assert held.ok
    claimed = h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 1})
    assert claimed.ok and not claimed.blocked
    assert claim_ids(claimed) == [first]
    # The claim (FOR NO KEY UPDATE, then an UPDATE that changes no key) and the KEY SHARE holder
    # both commit.
    assert h.step(a, "a_commit", "COMMIT").ok
    assert job(conn, first)["state"] == "running"
    assert job(conn, second)["state"] == "pending"


def test_a_share_lock_does_hide_a_job_from_claim_but_is_not_waited_for(
        h: Harness, conn: psycopg.Connection) -> None:
    """The contrast to scenario 2: FOR SHARE conflicts with FOR NO KEY UPDATE, so it is skipped."""
    first, second = enqueue(conn, 2)
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_share", "SELECT id FROM pgq.jobs WHERE id = %s FOR SHARE", (first,))
    claimed = h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 2})
    assert claimed.ok and not claimed.blocked
    assert claim_ids(claimed) == [second]
    h.step(a, "a_commit", "COMMIT")


# 3 ------------------------------------------------------------------------------------------------

def test_a_third_session_skips_a_row_another_session_waits_to_lock_without_deadlock(
        h: Harness, conn: psycopg.Connection) -> None:
    first, second, third = enqueue(conn, 3)
    a, b, c = h.session("a"), h.session("b"), h.session("c")
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_lock", "SELECT id FROM pgq.jobs WHERE id = %s FOR NO KEY UPDATE", (first,))
    cancel = h.step(b, "b_cancel", "SELECT pgq.cancel(%s)", (first,))
    assert cancel.blocked and cancel.blocked_by == ["a"]
    claimed = h.step(c, "c_claim", CLAIM, {"w": "c", "batch": 2})
    assert claimed.ok and not claimed.blocked, claimed.outcome
    assert claim_ids(claimed) == [second, third]
    assert h.step(a, "a_commit", "COMMIT").ok
    h.wait(cancel)
    assert cancel.ok and cancel.value is True
    assert [job(conn, i)["state"] for i in (first, second, third)] == ["cancelled", "running", "running"]
    assert not [s for s in h.steps if s.sqlstate == "40P01"]


# 4 ------------------------------------------------------------------------------------------------

CHANGES = {
    "cancelled": "SELECT pgq.cancel(%(id)s)",
    "claimed": "SELECT id FROM pgq.claim(worker => 'c', queues => ARRAY['q'], batch => 1)",
    "not_due": "UPDATE pgq.jobs SET run_at = now() + interval '1 hour' WHERE id = %(id)s",
    "exhausted": "UPDATE pgq.jobs SET attempt = max_attempts WHERE id = %(id)s",
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_row_changed_between_the_claims_snapshot_and_its_lock_is_rechecked_and_never_returned(
        h: Harness, conn: psycopg.Connection, change: str) -> None:
    first, second = enqueue(conn, 2)
    install_gated_clock(conn)
    b, c, gate = h.session("b"), h.session("c"), h.session("gate")
    h.step(gate, "gate_close", "SELECT pg_advisory_lock(%s)", (GATE_KEY,))
    h.step(b, "b_gate_on", "SET pgq_test.gate = 'on'")
    claim = h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 2})
    # b has its snapshot (both jobs pending and due) and waits in the scan's filter.
    assert claim.blocked and claim.blocked_by == ["gate"], claim.outcome
    changed = h.step(c, f"c_{change}", CHANGES[change], {"id": first})
    assert changed.ok and not changed.blocked, changed.outcome
    if change == "claimed":
        assert claim_ids(changed) == [first]
    h.step(gate, "gate_open", "SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    h.wait(claim)
    # Re-checked on the newest row version: the changed job is skipped; the batch is short.
    assert claim_ids(claim) == [second]
    row = job(conn, first)
    assert row["claimed_by"] in (None, "c")
    assert [e for e in events(conn, first) if e[0] == "claimed"] == (
        [("claimed", 1, "pending", "running")] if change == "claimed" else [])


# 5 ------------------------------------------------------------------------------------------------

def _running_expired(conn: psycopg.Connection, h: Harness) -> tuple[int, int]:
    (job_id,) = enqueue(conn, 1)
    owner = h.session("owner")
    (claimed,) = claim_ids(h.step(owner, "owner_claim", CLAIM, {"w": "owner", "batch": 1}))
    assert claimed == job_id
    expire_lease(conn, job_id)
    return job_id, 1


def test_a_job_completed_while_a_sweep_runs_stays_done(h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = _running_expired(conn, h)
    install_gated_clock(conn)
    sweeper, gate = h.session("sweeper"), h.session("gate")
    h.step(gate, "gate_close", "SELECT pg_advisory_lock(%s)", (GATE_KEY,))
    h.step(sweeper, "sweeper_gate_on", "SET pgq_test.gate = 'on'")
    sweep = h.step(sweeper, "sweep", "SELECT pgq.sweep()")
    assert sweep.blocked, sweep.outcome  # between its snapshot (job running, expired) and its lock
    done = h.step("owner", "owner_complete", "SELECT pgq.complete(%s, %s)", (job_id, attempt))
    assert done.ok and done.value is True and not done.blocked
    h.step(gate, "gate_open", "SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    h.wait(sweep)
    assert sweep.ok and sweep.value == 0
    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["last_event"]) == ("done", 1, "completed")
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "completed"]


def test_a_complete_waiting_behind_a_sweep_that_recovered_the_job_is_rejected(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = _running_expired(conn, h)
    sweeper = h.session("sweeper")
    h.step(sweeper, "sweeper_begin", "BEGIN")
    assert h.step(sweeper, "sweep", "SELECT pgq.sweep()").value == 1
    done = h.step("owner", "owner_complete", "SELECT pgq.complete(%s, %s)", (job_id, attempt))
    assert done.blocked and done.blocked_by == ["sweeper"]
    h.step(sweeper, "sweeper_commit", "COMMIT")
    h.wait(done)
    assert done.ok and done.value is False
    row = job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("pending", 1)
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "lease_expired", "rejected"]


def test_a_sweep_skips_a_job_whose_completion_is_in_flight(h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = _running_expired(conn, h)
    h.step("owner", "owner_begin", "BEGIN")
    assert h.step("owner", "owner_complete", "SELECT pgq.complete(%s, %s)", (job_id, attempt)).value is True
    sweep = h.step(h.session("sweeper"), "sweep", "SELECT pgq.sweep()")
    assert sweep.ok and not sweep.blocked and sweep.value == 0
    h.step("owner", "owner_commit", "COMMIT")
    assert job(conn, job_id)["state"] == "done"


# 6 ------------------------------------------------------------------------------------------------

def test_a_sweep_racing_a_reclaim_leaves_the_fresh_attempt_untouched(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id, _ = _running_expired(conn, h)
    install_gated_clock(conn)
    sweeper, gate, rescuer = h.session("sweeper"), h.session("gate"), h.session("rescuer")
    h.step(gate, "gate_close", "SELECT pg_advisory_lock(%s)", (GATE_KEY,))
    h.step(sweeper, "sweeper_gate_on", "SET pgq_test.gate = 'on'")
    sweep = h.step(sweeper, "sweep", "SELECT pgq.sweep()")
    assert sweep.blocked, sweep.outcome
    reclaim = h.step(rescuer, "rescuer_claim", CLAIM, {"w": "rescuer", "batch": 1})
    assert reclaim.rows == [(job_id, 2)]
    before = job(conn, job_id)
    h.step(gate, "gate_open", "SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    h.wait(sweep)
    assert sweep.ok and sweep.value == 0
    after = job(conn, job_id)
    assert after == before
    assert (after["state"], after["attempt"], after["claimed_by"]) == ("running", 2, "rescuer")
    assert h.step(rescuer, "rescuer_complete", "SELECT pgq.complete(%s, 2)", (job_id,)).value is True


def test_a_claim_skips_a_job_a_sweep_is_recovering_and_gets_it_after(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id, _ = _running_expired(conn, h)
    sweeper, rescuer = h.session("sweeper"), h.session("rescuer")
    h.step(sweeper, "sweeper_begin", "BEGIN")
    assert h.step(sweeper, "sweep", "SELECT pgq.sweep()").value == 1
    early = h.step(rescuer, "rescuer_claim1", CLAIM, {"w": "rescuer", "batch": 1})
    assert early.ok and not early.blocked and early.rows == []
    h.step(sweeper, "sweeper_commit", "COMMIT")
    late = h.step(rescuer, "rescuer_claim2", CLAIM, {"w": "rescuer", "batch": 1})
    assert late.rows == [(job_id, 2)]


# 7 ------------------------------------------------------------------------------------------------

def test_a_stale_attempts_complete_fail_renew_and_snooze_are_rejected_and_the_new_owner_completes(
        h: Harness, conn: psycopg.Connection) -> None:
    (job_id,) = enqueue(conn, 1)
    a, b = h.session("a"), h.session("b")
    assert h.step(a, "a_claim", CLAIM, {"w": "a", "batch": 1}).rows == [(job_id, 1)]
    expire_lease(conn, job_id)
    assert h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 1}).rows == [(job_id, 2)]
    before = job(conn, job_id)
    assert h.step(a, "a_complete", "SELECT pgq.complete(%s, 1)", (job_id,)).value is False
    assert h.step(a, "a_fail", "SELECT pgq.fail(%s, 1, 'boom')", (job_id,)).value is None
    assert h.step(a, "a_renew", "SELECT pgq.renew(%s, 1)", (job_id,)).value is None
    assert h.step(a, "a_snooze", "SELECT pgq.snooze(%s, 1, '1 minute')", (job_id,)).value is None
    assert h.step(a, "a_many", "SELECT * FROM pgq.complete_many(ARRAY[%s]::bigint[], ARRAY[1])",
                  (job_id,)).rows == []
    assert job(conn, job_id) == before
    assert h.step(b, "b_complete", "SELECT pgq.complete(%s, 2)", (job_id,)).value is True
    assert [(e[0], e[1]) for e in events(conn, job_id)] == [
        ("claimed", 1), ("lease_expired", 1), ("claimed", 2),
        ("rejected", 1), ("rejected", 1), ("rejected", 1), ("rejected", 1), ("rejected", 1),
        ("completed", 2)]
    assert (job(conn, job_id)["state"], job(conn, job_id)["attempt"]) == ("done", 2)


# 8 ------------------------------------------------------------------------------------------------

def test_renew_extends_the_lease_by_the_database_clock_and_fails_after_a_reclaim(
        h: Harness, conn: psycopg.Connection) -> None:
    (job_id,) = enqueue(conn, 1)
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_claim", "SELECT id FROM pgq.claim('a', ARRAY['q'], 1, interval '10 seconds')")
    # Renew's lease starts at the statement's database time, whatever the client's clock says.
    exact = h.step(a, "a_renew", "SELECT pgq.renew(%s, 1, interval '1 hour') = statement_timestamp() "
                   "+ interval '1 hour'", (job_id,))
    assert exact.value is True
    default = h.step(a, "a_renew_default", "SELECT pgq.renew(%s, 1) = statement_timestamp() "
                     "+ (SELECT lease FROM pgq.queues WHERE name = 'q')", (job_id,))
    assert default.value is True
    expire_lease(conn, job_id)
    assert h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 1}).rows == [(job_id, 2)]
    lease_b = job(conn, job_id)["lease_until"]
    assert h.step(a, "a_renew_late", "SELECT pgq.renew(%s, 1, interval '1 hour')", (job_id,)).value is None
    assert job(conn, job_id)["lease_until"] == lease_b


# 9 ------------------------------------------------------------------------------------------------

def _make_due(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (job_id,))


@pytest.mark.parametrize("detour", ["snooze", "release", "fail_then_retry", "cancel_then_retry"])
def test_an_old_attempt_never_becomes_valid_again_after_snooze_or_admin_retry(
        h: Harness, conn: psycopg.Connection, detour: str) -> None:
    (job_id,) = enqueue(conn, 1)
    a, admin, b = h.session("a"), h.session("admin"), h.session("b")
    assert h.step(a, "a_claim", CLAIM, {"w": "a", "batch": 1}).rows == [(job_id, 1)]
    if detour == "snooze":
        assert h.step(a, "a_snooze", "SELECT pgq.snooze(%s, 1, '1 hour')", (job_id,)).value is not None
        _make_due(conn, job_id)
    elif detour == "release":
        assert h.step(a, "a_release", "SELECT pgq.release(%s, 1)", (job_id,)).value is True
    elif detour == "fail_then_retry":
        assert h.step(a, "a_fail", "SELECT pgq.fail(%s, 1, 'x', retryable => false)", (job_id,)).value == "failed"
        assert h.step(admin, "admin_retry", "SELECT pgq.retry(%s)", (job_id,)).value is True
    else:
        assert h.step(admin, "admin_cancel", "SELECT pgq.cancel(%s)", (job_id,)).value is True
        assert h.step(admin, "admin_retry", "SELECT pgq.retry(%s)", (job_id,)).value is True
    # Pending again with attempt 1 kept: attempt 1 is still not an owner.
    assert (job(conn, job_id)["state"], job(conn, job_id)["attempt"]) == ("pending", 1)
    assert h.step(a, "a_complete_pending", "SELECT pgq.complete(%s, 1)", (job_id,)).value is False
    assert h.step(a, "a_renew_pending", "SELECT pgq.renew(%s, 1)", (job_id,)).value is None
    assert h.step(b, "b_claim", CLAIM, {"w": "b", "batch": 1}).rows == [(job_id, 2)]
    assert h.step(a, "a_complete", "SELECT pgq.complete(%s, 1)", (job_id,)).value is False
    assert h.step(a, "a_fail_late", "SELECT pgq.fail(%s, 1, 'late')", (job_id,)).value is None
    assert h.step(a, "a_snooze_late", "SELECT pgq.snooze(%s, 1, '1 minute')", (job_id,)).value is None
    assert h.step(b, "b_complete", "SELECT pgq.complete(%s, 2)", (job_id,)).value is True
    assert (job(conn, job_id)["state"], job(conn, job_id)["attempt"]) == ("done", 2)


# 10 -----------------------------------------------------------------------------------------------

def test_exhausted_jobs_are_never_claimed_and_use_no_batch_slots(h: Harness, conn: psycopg.Connection) -> None:
    exhausted = enqueue(conn, 3, priority=5)
    fresh = enqueue(conn, 2)
    conn.execute("UPDATE pgq.jobs SET attempt = max_attempts WHERE id = ANY (%s)", (exhausted,))
    # One more: its last attempt is running with an expired lease (the claim recovers it first).
    (last,) = enqueue(conn, 1, priority=9, max_attempts=1)
    w = h.session("w")
    assert h.step(w, "w_claim_last", CLAIM, {"w": "w", "batch": 1}).rows == [(last, 1)]
    expire_lease(conn, last)
    got = h.step(w, "w_claim", CLAIM, {"w": "w", "batch": 2})
    assert claim_ids(got) == fresh
    assert job(conn, last)["state"] == "failed"
    assert h.step(w, "w_claim_again", CLAIM, {"w": "w", "batch": 5}).rows == []
    assert [job(conn, i)["state"] for i in exhausted] == ["pending"] * 3
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = ANY (%s)", (exhausted,)) == 0


# 11 -----------------------------------------------------------------------------------------------

def test_two_sessions_completing_the_same_pairs_in_opposite_orders_never_deadlock(
        dsn: str, conn: psycopg.Connection) -> None:
    # A worker that repeats a complete_many after an ambiguous commit can race its first call.
    # Each call locks its rows in id order whatever order the pairs come in, so neither waits for
    # a row the other holds while holding one the other wants.
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[1000]))")
    answers: list[list[int]] = []
    failures: list[str] = []
    lock = threading.Lock()
    for _ in range(20):
        pairs = conn.execute(CLAIM, {"w": "w", "batch": 50}).fetchall()
        ids, attempts = [p[0] for p in pairs], [p[1] for p in pairs]
        start = threading.Barrier(2)

        # The threads are joined within the iteration: this round's ids, attempts and start it is.
        def complete(reverse: bool) -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SET deadlock_timeout = '10ms'")
                start.wait(DEADLINE)  # noqa: B023
                try:
                    got = c.execute("SELECT * FROM pgq.complete_many(%s::bigint[], %s::integer[])",
                                    (ids[::-1], attempts[::-1]) if reverse else (ids, attempts),  # noqa: B023
                                    ).fetchall()
                    with lock:
                        answers.append(sorted(r[0] for r in got))
                except psycopg.Error as exc:
                    with lock:
                        failures.append(f"{exc.sqlstate} {exc}")

        threads = [threading.Thread(target=complete, args=(r,)) for r in (False, True)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(DEADLINE)
        assert failures == []
        # Both calls answer every pair as completed (the later one by idempotence) ...
        assert answers[-2:] == [sorted(ids), sorted(ids)]
    # ... and each job was completed once.
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'completed'") == 1000
    assert one(conn, "SELECT count(DISTINCT job_id) FROM pgq.job_events WHERE event = 'completed'") == 1000


@pytest.mark.slow
def test_many_sessions_claiming_completing_sweeping_and_cancelling_never_deadlock(
        dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', lease => interval '50 milliseconds')")
    # The sessions run at least 10 s, and on until the run has shown what the checks below need
    # (2000 iterations, a stale completion rejected): a loaded machine runs longer instead of
    # failing. The hard deadline only keeps a broken run finite.
    min_seconds, max_seconds = 10.0, 120.0
    stop = threading.Event()
    iterations = {"n": 0}
    failures: list[str] = []
    deadlocks: list[str] = []
    lock = threading.Lock()

    def session(role: str, seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SET deadlock_timeout = '10ms'")
            c.execute("SET lock_timeout = '5s'")
            done = 0
            while not stop.is_set() and done < 1500:
                done += 1
                try:
                    if role == "producer":
                        c.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))",
                                  (rnd.randint(1, 10),))
                    elif role == "worker":
                        rows = c.execute(CLAIM, {"w": f"w{seed}", "batch": rnd.randint(1, 8)}).fetchall()
                        rnd.shuffle(rows)
                        if rows and rnd.random() < 0.9:
                            if rnd.random() < 0.3:
                                time.sleep(0.06)  # past the lease: some completions go stale
                            c.execute("SELECT * FROM pgq.complete_many(%s::bigint[], %s::integer[])",
                                      ([r[0] for r in rows], [r[1] for r in rows]))
                    elif role == "sweeper":
                        c.execute("SELECT pgq.sweep(50)")
                    else:  # canceller
                        # Ids of committed rows only: below max(id) there can be ids of a producer
                        # that has not committed yet (identity values are taken before COMMIT).
                        ids = [r[0] for r in c.execute(
                            "SELECT id FROM pgq.jobs TABLESAMPLE BERNOULLI (5) LIMIT 3").fetchall()]
                        for i in ids:
                            c.execute("SELECT pgq.cancel(%s)", (i,))
                except psycopg.Error as exc:
                    with lock:
                        (deadlocks if exc.sqlstate == "40P01" else failures).append(f"{role}: {exc.sqlstate} {exc}")
                with lock:
                    iterations["n"] += 1

    roles = ["producer", "producer"] + ["worker"] * 6 + ["sweeper", "canceller"]
    threads = [threading.Thread(target=session, args=(r, i)) for i, r in enumerate(roles)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        elapsed = time.monotonic() - started
        if elapsed > max_seconds or (
                elapsed >= min_seconds and iterations["n"] >= 2000
                and one(conn, "SELECT EXISTS (SELECT FROM pgq.job_events WHERE event = 'rejected')")):
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert deadlocks == []
    # cancel raising for an unknown id is impossible (ids come from committed rows, nothing is
    # pruned here); nothing else may fail.
    assert failures == []
    assert iterations["n"] >= 2000, iterations
    # Invariants: at most one completion per job, by the attempt that owned it; attempts in range.
    assert one(conn, "SELECT count(*) FROM (SELECT job_id FROM pgq.job_events WHERE event = 'completed' "
                     "GROUP BY job_id HAVING count(*) > 1) AS d") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs AS j JOIN pgq.job_events AS e ON e.job_id = j.id "
                     "AND e.event = 'completed' WHERE j.state <> 'done' OR e.attempt <> j.attempt") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done' AND NOT EXISTS (SELECT FROM "
                     "pgq.job_events AS e WHERE e.job_id = jobs.id AND e.event = 'completed')") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE attempt > max_attempts OR attempt < 0") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") > 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'rejected'") > 0
    # Quiet now: a sweep leaves no lease that had expired when it ran behind.
    swept_at = one(conn, "SELECT clock_timestamp()")
    one(conn, "SELECT pgq.sweep(100000)")
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running' AND lease_until < %s", (swept_at,)) == 0
