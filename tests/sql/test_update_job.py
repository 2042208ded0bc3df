"""Issue 41, editing a queued job: pgq.update_job gives a job that has not started (pending or
waiting, and no claim holds it) a new payload, priority, run_at or meta and answers true; a job a
claim holds, or that runs or has ended, answers false and is left as it was, at once (never a wait
for a worker). For the login that enqueued it and for admins. Races: a claim in flight and an edit,
in every order (the lab harness, with the gated clock between the claim's snapshot and its lock),
and many claimers against many editors: a job whose edit answered true is never handed out with
its old payload, and one handed out with its old payload had its edit answer false."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgq_tools.lab.harness import Harness

from loginkit import BOSS, PROD, PROD2, Login
from sqlhelpers import GATE_KEY, claim, events, install_gated_clock, job, one

CLAIM = "SELECT id, attempt, payload FROM pgq.claim(worker => %(w)s, queues => ARRAY['q'], batch => 1)"
UPDATE = "SELECT pgq.update_job(%(id)s, payload => %(payload)s)"


def update(conn: psycopg.Connection, job_id: int, **fields: object) -> bool:
    args = "".join(f", {k} => %({k})s" for k in fields)
    params = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in fields.items()}
    return bool(one(conn, f"SELECT pgq.update_job(%(id)s{args})", {"id": job_id, **params}))


def test_a_pending_job_takes_what_the_call_names_and_keeps_the_rest(conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}', priority => 3, meta => '{\"m\": 1}')")
    assert update(conn, job_id, payload={"v": 2}) is True
    row = job(conn, job_id)
    assert (row["payload"], row["priority"], row["meta"], row["state"]) == ({"v": 2}, 3, {"m": 1}, "pending")
    later = one(conn, "SELECT now() + interval '1 hour'")
    assert update(conn, job_id, priority=-5, run_at=later, meta={"m": 2}) is True
    row = job(conn, job_id)
    assert (row["payload"], row["priority"], row["run_at"], row["meta"]) == ({"v": 2}, -5, later, {"m": 2})
    assert claim(conn) == []  # not due any more
    assert update(conn, job_id, run_at=one(conn, "SELECT now() - interval '1 second'")) is True
    (claimed,) = claim(conn)
    assert (claimed["id"], claimed["payload"], claimed["meta"]) == (job_id, {"v": 2}, {"m": 2})


def test_a_waiting_job_is_edited_and_runs_with_it_once_released(conn: psycopg.Connection) -> None:
    first = one(conn, "SELECT pgq.enqueue('q', 'first')")
    second = one(conn, "SELECT pgq.enqueue('q', 'second', '{\"v\": 1}', depends_on => ARRAY[%s]::bigint[])",
                 (first,))
    assert job(conn, second)["state"] == "waiting"
    assert update(conn, second, payload={"v": 2}) is True
    (c,) = claim(conn)
    assert c["id"] == first
    assert one(conn, "SELECT pgq.complete(%s, %s)", (first, c["attempt"])) is True
    (c,) = claim(conn)
    assert (c["id"], c["payload"]) == (second, {"v": 2})


def test_a_started_or_ended_job_answers_false_and_is_left_as_it_was(conn: psycopg.Connection) -> None:
    running = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    (c,) = claim(conn)
    done = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    (d,) = claim(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (done, d["attempt"]))
    cancelled = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    conn.execute("SELECT pgq.cancel(%s)", (cancelled,))
    unknown = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    (u,) = claim(conn)
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (unknown, u["attempt"]))
    for job_id in (running, done, cancelled, unknown):
        before = job(conn, job_id)
        assert update(conn, job_id, payload={"v": 2}, priority=9) is False
        assert job(conn, job_id) == before
    assert c["id"] == running


def test_only_the_login_that_enqueued_it_and_admins_may_edit_it(conn: psycopg.Connection, login: Login) -> None:
    prod, other, boss = login(PROD), login(PROD2), login(BOSS)
    job_id = one(prod, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    before = job(conn, job_id)
    with pytest.raises(psycopg.errors.NoDataFound, match=f"no job with id {job_id}"):
        update(other, job_id, payload={"v": 666})
    with pytest.raises(psycopg.errors.NoDataFound, match="no job with id 424242"):
        update(other, 424242, payload={"v": 666})
    assert job(conn, job_id) == before
    assert update(prod, job_id, payload={"v": 2}) is True
    assert update(boss, job_id, priority=7) is True
    row = job(conn, job_id)
    assert (row["payload"], row["priority"]) == ({"v": 2}, 7)


def test_a_run_at_not_before_the_jobs_start_by_is_refused_and_nothing_written(conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => now() + interval '1 minute')")
    before = job(conn, job_id)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='argument "run_at"'):
        update(conn, job_id, payload={"v": 2}, run_at=one(conn, "SELECT now() + interval '2 minutes'"))
    assert job(conn, job_id) == before


def test_an_audited_queue_records_the_edit_and_the_fields_given(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', audit => true)")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    assert update(conn, job_id, payload={"v": 2}, meta={"m": 1}) is True
    assert ("updated", 0, "pending", "pending") in events(conn, job_id)
    assert one(conn, "SELECT note FROM pgq.job_events WHERE job_id = %s AND event = 'updated'",
               (job_id,)) == "payload, meta"


def test_a_due_edit_notifies_the_queue(conn: psycopg.Connection, dsn: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', run_at => now() + interval '1 hour')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq")
        assert update(conn, job_id, run_at=one(conn, "SELECT now()")) is True
        got = next(listener.notifies(timeout=10, stop_after=1))
    assert (got.channel, got.payload) == ("pgq", "q")


# A claim in flight and an edit -------------------------------------------------------------------

@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="update_job", step_timeout=10)
    yield harness
    harness.close()


def test_an_edit_of_a_job_a_claim_holds_answers_false_at_once_and_the_claim_keeps_its_payload(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    worker, producer = h.session("worker"), h.session("producer")
    h.step(worker, "w_begin", "BEGIN")
    claimed = h.step(worker, "w_claim", CLAIM, {"w": "worker"})
    assert claimed.rows == [(job_id, 1, {"v": 1})]
    edit = h.step(producer, "p_update", UPDATE, {"id": job_id, "payload": Jsonb({"v": 2})})
    assert edit.ok and not edit.blocked and edit.value is False, edit.outcome
    assert h.step(worker, "w_commit", "COMMIT").ok
    assert job(conn, job_id)["payload"] == {"v": 1}


def test_a_claim_skips_a_job_an_open_edit_holds_and_then_hands_it_out_edited(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    worker, producer = h.session("worker"), h.session("producer")
    h.step(producer, "p_begin", "BEGIN")
    edit = h.step(producer, "p_update", UPDATE, {"id": job_id, "payload": Jsonb({"v": 2})})
    assert edit.ok and edit.value is True
    skipped = h.step(worker, "w_claim1", CLAIM, {"w": "worker"})
    assert skipped.ok and not skipped.blocked and skipped.rows == [], skipped.outcome
    assert h.step(producer, "p_commit", "COMMIT").ok
    assert h.step(worker, "w_claim2", CLAIM, {"w": "worker"}).rows == [(job_id, 1, {"v": 2})]


@pytest.mark.parametrize("edit", ["payload", "not_due"])
def test_an_edit_between_a_claims_snapshot_and_its_lock_is_what_the_claim_sees(
        h: Harness, conn: psycopg.Connection, edit: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"v\": 1}')")
    install_gated_clock(conn)
    worker, producer, gate = h.session("worker"), h.session("producer"), h.session("gate")
    h.step(gate, "gate_close", "SELECT pg_advisory_lock(%s)", (GATE_KEY,))
    h.step(worker, "w_gate_on", "SET pgq_test.gate = 'on'")
    claimed = h.step(worker, "w_claim", CLAIM, {"w": "worker"})
    assert claimed.blocked and claimed.blocked_by == ["gate"], claimed.outcome  # its snapshot: v1, due
    if edit == "payload":
        changed = h.step(producer, "p_update", UPDATE, {"id": job_id, "payload": Jsonb({"v": 2})})
    else:
        changed = h.step(producer, "p_update", "SELECT pgq.update_job(%(id)s, run_at => now() + interval '1 hour')",
                         {"id": job_id})
    assert changed.ok and not changed.blocked and changed.value is True, changed.outcome
    h.step(gate, "gate_open", "SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    h.wait(claimed)
    # The claim re-checks the row it locks on its newest version: the edited job, or none.
    assert claimed.rows == ([(job_id, 1, {"v": 2})] if edit == "payload" else []), claimed.outcome


def test_many_claimers_and_editors_never_hand_out_an_old_payload_whose_edit_answered_true(
        conn: psycopg.Connection, dsn: str) -> None:
    n = 300
    ids = [r[0] for r in conn.execute(
        "SELECT pgq.enqueue_many('q', 'k', array_agg(jsonb_build_object('v', 1))) FROM generate_series(1, %s)",
        (n,)).fetchall()]
    edited: dict[int, bool] = {}
    handed: dict[int, dict] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    # Both outcomes, whatever the speeds: each claimer's first claim (the lowest ids) comes before
    # any edit, the editors' first edits (the highest ids) before any second claim; then all race.
    first_claims, first_edit = threading.Barrier(4), threading.Event()

    def editor(mine: list[int]) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                first_claims.wait(timeout=60)
                for job_id in mine:
                    answer = update(c, job_id, payload={"v": 2})
                    with lock:
                        edited[job_id] = answer
                    first_edit.set()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)
            first_edit.set()

    def claimer(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                rounds = 0
                while True:
                    rows = c.execute("SELECT id, payload FROM pgq.claim(%s, ARRAY['q'], 1)", (name,)).fetchall()
                    with lock:
                        handed.update(dict(rows))
                    rounds += 1
                    if rounds == 1:
                        first_claims.wait(timeout=60)
                        assert first_edit.wait(timeout=60)
                    if not rows and len(edited) == n and not c.execute(
                            "SELECT FROM pgq.jobs WHERE state = 'pending'").fetchone():
                        return
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    # The editors go from the highest id down, the claimers from the lowest up: they meet.
    down = ids[::-1]
    threads = [threading.Thread(target=editor, args=(down[i::2],)) for i in range(2)]
    threads += [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not [t for t in threads if t.is_alive()]
    assert sorted(handed) == ids and sorted(edited) == ids
    # Each job was handed out once, with the payload its edit's answer says it had.
    wrong = [i for i in ids if handed[i] != ({"v": 2} if edited[i] else {"v": 1})]
    assert not wrong, [(i, edited[i], handed[i]) for i in wrong[:5]]
    assert edited[ids[0]] is False and edited[ids[-1]] is True
