"""A Hypothesis state machine drives the SQL API and compares pgq with a small Python model of the
queue after every step (TESTING.md scenario 18), checking invariants (a)-(f) each time. Jobs may
depend on earlier jobs (enqueue's depends_on, issue 11): the model keeps each waiting job's open
dependencies, releases it when the last is done and cancels the chain when one fails or is
cancelled, in bounded steps (issue 24): an end moves on at most STEP dependants (the test replaces
pgq._dependency_step(), 1000, by STEP), breadth first down the chain, and leaves the rest to the
backlog, which each sweep works through oldest first, max_jobs at a time; an end in a claim's
recovery of expired leases leaves all of them to it.

Time is under the test's control. pgq reads "now" for every lease and run_at decision through
pgq._now(), an inlinable function owned by the schema owner. In this test's database only, the
superuser replaces it with ``statement_timestamp() + (SELECT shift FROM pgq_test.clock)``, where
pgq_test is a schema nobody else may use: the test advances time by updating that row. This is a
test-only arrangement: a production database must never have it, since whoever can move pgq's
clock can expire every lease at will. Ordinary roles cannot move it here either (checked below):
they may not replace a function they do not own, nor touch pgq_test. (A custom GUC such as
pgq_test.offset would not do: any role may SET a placeholder variable in its own session.)

Durations are chosen so that real time passing during the test (seconds) never decides anything:
the clock moves in steps of 10 or 70 minutes, leases last 65 minutes and a failed attempt is
retried after exactly 15 minutes (backoff_base = backoff_cap), so no deadline ever falls within
minutes of a moment the test looks at.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sqlhelpers import one

LEASE_MIN = 65
RETRY_MIN = 15
STEP = 3  # pgq._dependency_step() in this test's database
TERMINAL = ("done", "failed", "cancelled")
#: What the runs exercised, so that a model that never reaches a branch does not pass silently.
EXERCISED: Counter[str] = Counter()


def install_test_clock(conn: psycopg.Connection) -> None:
    conn.execute("CREATE SCHEMA pgq_test")
    conn.execute("REVOKE ALL ON SCHEMA pgq_test FROM PUBLIC")
    conn.execute("CREATE TABLE pgq_test.clock (shift interval NOT NULL)")
    conn.execute("INSERT INTO pgq_test.clock VALUES ('0')")
    conn.execute("""CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz LANGUAGE sql STABLE
                    AS $$ SELECT statement_timestamp() + (SELECT shift FROM pgq_test.clock) $$""")


def test_only_the_schema_owner_can_move_the_test_clock(conn: psycopg.Connection, connect) -> None:
    install_test_clock(conn)
    for role in ("pgq_worker", "pgq_admin", "pgq_producer", "pgq_monitor"):
        c = connect(role=role)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("UPDATE pgq_test.clock SET shift = '1 day'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz LANGUAGE sql "
                      "AS $$ SELECT now() + interval '1 day' $$")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT pgq._now()")
    owner = one(conn, "SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'pgq._now()'::regprocedure")
    assert owner == one(conn, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'pgq'")
    # The moved clock is what pgq's functions see.
    conn.execute("UPDATE pgq_test.clock SET shift = '2 hours'")
    assert one(conn, "SELECT round(extract(epoch FROM pgq._now() - statement_timestamp()))") == 7200


@dataclass
class MJob:
    id: int
    priority: int
    max_attempts: int
    state: str = "pending"
    attempt: int = 0
    run_at: tuple[int, int] = (0, 0)  # (clock minutes, step number): orders like the database does
    lease_until: int | None = None    # clock minutes
    last_event: str = "enqueued"
    completions: int = 0
    waiting_for: set[int] = field(default_factory=set)  # while waiting: the dependencies not done yet
    mode: str = "all_done"  # dependency_mode: all_ended counts a failed or cancelled dependency as ended


@dataclass
class Item:
    """A row of pgq.cascade_backlog: the dependants of job (ended `state`) with ids in [low, below)."""
    job: int
    state: str
    low: int
    below: int


@dataclass
class Model:
    now: int = 0  # minutes the clock has been moved
    seq: int = 0
    jobs: dict[int, MJob] = field(default_factory=dict)
    pairs: list[tuple[int, int]] = field(default_factory=list)  # every (id, attempt) ever claimed
    backlog: list[Item] = field(default_factory=list)

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def next_id(self) -> int:
        return max(self.jobs, default=0) + 1

    def recover(self, limit: int) -> int:
        """A claim's or a sweep's recovery of expired leases: their ends leave every dependant to the
        backlog."""
        expired = sorted((j for j in self.jobs.values()
                          if j.state == "running" and j.lease_until is not None and j.lease_until < self.now),
                         key=lambda j: j.lease_until or 0)[:limit]
        for j in expired:
            j.state = "failed" if j.attempt >= j.max_attempts else "pending"
            EXERCISED[f"lease expired, now {j.state}"] += 1
            j.lease_until = None
            j.last_event = "lease_expired"
            if j.state == "failed" and self.dependants(j.id, 0, self.next_id()):
                self.backlog.append(Item(j.id, j.state, self.low(j.id), self.next_id()))
                EXERCISED["an end in a recovery left its dependants to the sweep"] += 1
        return len(expired)

    def dependants(self, job_id: int, low: int, below: int) -> list[MJob]:
        """The jobs still linked to job_id (waiting for it), ids in [low, below), in id order."""
        return sorted((j for j in self.jobs.values() if job_id in j.waiting_for and low <= j.id < below),
                      key=lambda j: j.id)

    def low(self, job_id: int) -> int:
        """Where an end's dependants start: past those an earlier end's backlog rows hold (a retry)."""
        return max((i.below for i in self.backlog if i.job == job_id), default=0)

    def work(self, item: Item, budget: int) -> tuple[int, bool, list[int]]:
        """pgq._dependency_work: (budget used, dependants left, cancelled ones with dependants)."""
        candidates = self.dependants(item.job, item.low, item.below)[:budget]
        used, cancelled = 0, []
        for j in candidates:
            if item.state == "done" or j.mode == "all_ended":
                if used and used + 1 > budget:  # a release counts one, after a cancellation's links too
                    break
                used += 1
                j.waiting_for.discard(item.job)
                if item.state != "done":
                    EXERCISED["all_ended: counted a dependency that ended " + item.state] += 1
                if not j.waiting_for:
                    j.state, j.last_event = "pending", "dependencies_done"
                    EXERCISED["released by the last dependency"] += 1
            else:
                cost = len(j.waiting_for)  # the links its cancellation deletes
                if used and used + cost > budget:
                    break
                used += cost
                j.state, j.last_event, j.waiting_for = "cancelled", "dependency_ended", set()
                EXERCISED["cancelled with its dependency"] += 1
                if any(j.id in k.waiting_for for k in self.jobs.values()):
                    cancelled.append(j.id)
        return used, bool(self.dependants(item.job, item.low, item.below)), cancelled

    def ended(self, job: MJob, budget: int = STEP) -> None:
        """An end by complete, fail or cancel (pgq._dependency_ended): its dependants move on, up to
        the call's budget, breadth first; what is left goes to the backlog, in order."""
        job.waiting_for = set()  # a waiting job that ends deletes its own links
        if job.state not in TERMINAL or not self.dependants(job.id, 0, self.next_id()):
            return
        below = self.next_id()
        todo, more = [Item(job.id, job.state, self.low(job.id), below)], [True]
        i, left = 0, budget
        while i < len(todo) and left > 0:
            used, more[i], cancelled = self.work(todo[i], left)
            left -= used
            todo += [Item(c, "cancelled", 0, below) for c in cancelled]
            more += [True] * len(cancelled)
            i += 1
        left_over = [item for item, m in zip(todo, more) if m]
        if left_over:
            EXERCISED["an end left dependants to the backlog"] += 1
        self.backlog += left_over

    def work_backlog(self, budget: int) -> None:
        """The sweep's step: the backlog, oldest first, until the budget is used up."""
        below, i, left = self.next_id(), 0, budget
        while left > 0 and i < len(self.backlog):
            item = self.backlog[i]
            used, more, cancelled = self.work(item, left)
            left -= used
            self.backlog += [Item(c, "cancelled", 0, below) for c in cancelled]
            if used:
                EXERCISED["the sweep moved dependants on from the backlog"] += 1
            if more:
                i += 1
            else:
                del self.backlog[i]


class QueueMachine(RuleBasedStateMachine):
    dsn: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        tables = [t for t in ("pgq.jobs", "pgq.job_events", "pgq.job_dependencies", "pgq.overlap_checks",
                              "pgq.cascade_backlog", "pgq.job_dependants", "pgq.cascade_budgets")
                  if self.q("SELECT to_regclass(%s) IS NOT NULL", (t,))]
        self.conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
        self.conn.execute("UPDATE pgq_test.clock SET shift = '0'")
        self.model = Model()
        self.previous: dict[int, tuple[Any, ...]] = {}
        self.retried: int | None = None
        self.swept = False

    def teardown(self) -> None:
        self.conn.close()

    # Helpers ------------------------------------------------------------------------------------

    def q(self, sql: str, params: Any = None) -> Any:
        return one(self.conn, sql, params)

    def db_minutes(self, column: str, job_id: int) -> float:
        return float(self.q(f"SELECT extract(epoch FROM {column} - pgq._now()) / 60 FROM pgq.jobs WHERE id = %s",
                            (job_id,)))

    # Rules --------------------------------------------------------------------------------------

    @initialize(jobs=st.lists(st.tuples(st.sampled_from([0, 0, 1]), st.sampled_from([3, 1, 2])),
                              min_size=1, max_size=4))
    def some_jobs(self, jobs: list[tuple[int, int]]) -> None:
        for priority, max_attempts in jobs:
            self.enqueue(priority, max_attempts)

    @rule(priority=st.sampled_from([0, 0, 1]), max_attempts=st.sampled_from([3, 1, 2]))
    def enqueue(self, priority: int, max_attempts: int) -> None:
        job_id = self.q("SELECT pgq.enqueue('q', 'k', '{}', priority => %s, max_attempts => %s)",
                        (priority, max_attempts))
        assert job_id not in self.model.jobs
        self.model.jobs[job_id] = MJob(job_id, priority, max_attempts, run_at=(0, self.model.tick()))

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data(), max_attempts=st.sampled_from([3, 1, 2]), mode=st.sampled_from(["all_done", "all_ended"]))
    def enqueue_dependant(self, data: st.DataObject, max_attempts: int, mode: str) -> None:
        m = self.model
        deps = data.draw(st.lists(st.sampled_from(sorted(m.jobs)), min_size=1, max_size=3))
        job_id = self.q("SELECT pgq.enqueue('q', 'k', '{}', max_attempts => %s, depends_on => %s, "
                        "dependency_mode => %s)", (max_attempts, deps, mode))
        j = m.jobs[job_id] = MJob(job_id, 0, max_attempts, run_at=(0, m.tick()), mode=mode)
        if mode == "all_ended":
            j.waiting_for = {d for d in deps if m.jobs[d].state not in TERMINAL}
            if j.waiting_for:
                j.state = "waiting"
                EXERCISED["all_ended: enqueued waiting"] += 1
            else:
                EXERCISED["all_ended: enqueued pending, its dependencies had ended"] += 1
        elif any(m.jobs[d].state in ("failed", "cancelled") for d in deps):
            j.state, j.last_event = "cancelled", "dependency_ended"
            EXERCISED["enqueued cancelled: a dependency had ended"] += 1
        elif any(m.jobs[d].state != "done" for d in deps):
            j.state, j.waiting_for = "waiting", {d for d in deps if m.jobs[d].state != "done"}
            EXERCISED["enqueued waiting"] += 1
        else:
            EXERCISED["enqueued pending: its dependencies were done"] += 1

    @rule(batch=st.sampled_from([3, 1, 2]))
    def claim(self, batch: int) -> None:
        rows = self.conn.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['q'], %s)", (batch,)).fetchall()
        m = self.model
        m.recover(100)
        due = sorted((j for j in m.jobs.values()
                      if j.state == "pending" and j.attempt < j.max_attempts and j.run_at[0] <= m.now),
                     key=lambda j: (-j.priority, j.run_at, j.id))[:batch]
        for j in due:
            j.state, j.attempt, j.lease_until, j.last_event = "running", j.attempt + 1, m.now + LEASE_MIN, "claimed"
            m.pairs.append((j.id, j.attempt))
            EXERCISED["claimed"] += 1
        assert [tuple(r) for r in rows] == [(j.id, j.attempt) for j in due]

    def _pair(self, data: st.DataObject, stale: bool) -> tuple[int, int]:
        m = self.model
        if stale:
            current = {(j.id, j.attempt) for j in m.jobs.values() if j.state == "running"}
            choices = [p for p in m.pairs if p not in current] or m.pairs
        else:
            choices = [(j.id, j.attempt) for j in m.jobs.values() if j.state == "running"] or m.pairs
        return data.draw(st.sampled_from(choices))

    @precondition(lambda self: self.model.pairs)
    @rule(data=st.data(), stale=st.booleans())
    def renew(self, data: st.DataObject, stale: bool) -> None:
        job_id, attempt = self._pair(data, stale)
        until = self.q("SELECT pgq.renew(%s, %s)", (job_id, attempt))
        j = self.model.jobs[job_id]
        if j.state == "running" and j.attempt == attempt:
            assert until is not None
            j.lease_until = self.model.now + LEASE_MIN
            assert abs(self.db_minutes("lease_until", job_id) - LEASE_MIN) < 0.5
            EXERCISED["renewed"] += 1
        else:
            assert until is None
            EXERCISED["stale renew rejected"] += 1

    @precondition(lambda self: self.model.pairs)
    @rule(data=st.data(), stale=st.booleans())
    def complete(self, data: st.DataObject, stale: bool) -> None:
        job_id, attempt = self._pair(data, stale)
        answer = self.q("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        j = self.model.jobs[job_id]
        if j.state == "running" and j.attempt == attempt:
            j.state, j.lease_until, j.last_event = "done", None, "completed"
            j.completions += 1
            self.model.ended(j)
            expected = True
        else:
            expected = j.attempt == attempt and j.state == "done" and j.last_event == "completed"
        EXERCISED["completed" if j.state == "done" and expected else "stale complete rejected"] += 1
        assert answer is expected

    @precondition(lambda self: self.model.pairs)
    @rule(data=st.data(), stale=st.booleans(), retryable=st.sampled_from([True, False]))
    def fail(self, data: st.DataObject, stale: bool, retryable: bool) -> None:
        job_id, attempt = self._pair(data, stale)
        answer = self.q("SELECT pgq.fail(%s, %s, 'boom', retryable => %s)", (job_id, attempt, retryable))
        m = self.model
        j = m.jobs[job_id]
        if j.state == "running" and j.attempt == attempt:
            j.lease_until, j.last_event = None, "failed"
            if not retryable or j.attempt >= j.max_attempts:
                j.state = "failed"
                m.ended(j)
            else:
                j.state, j.run_at = "pending", (m.now + RETRY_MIN, m.tick())
            expected = j.state
            EXERCISED[f"failed, now {j.state}"] += 1
        elif j.attempt == attempt and j.last_event == "failed":
            expected = j.state
        else:
            expected = None
        assert answer == expected

    @rule(minutes=st.sampled_from([10, 10, 70]))
    def advance_time(self, minutes: int) -> None:
        self.model.now += minutes
        self.conn.execute("UPDATE pgq_test.clock SET shift = make_interval(mins => %s)", (self.model.now,))

    @precondition(lambda self: self.model.backlog)
    @rule(max_jobs=st.sampled_from([1000, 2, 1]))
    def sweep_with_a_backlog(self, max_jobs: int) -> None:
        """A sweep while dependants wait in the backlog (the plain rule below may not come soon)."""
        self.sweep(max_jobs)

    @rule(max_jobs=st.sampled_from([1000, 2, 1]))
    def sweep(self, max_jobs: int) -> None:
        expired = sum(1 for j in self.model.jobs.values()
                      if j.state == "running" and j.lease_until is not None and j.lease_until < self.model.now)
        if expired > max_jobs:  # which of several expired at the same moment it recovers is not defined
            max_jobs = 1000
        assert self.q("SELECT pgq.sweep(%s)", (max_jobs,)) == self.model.recover(max_jobs)
        self.model.work_backlog(max_jobs)
        self.swept = True

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        m = self.model
        j = m.jobs[data.draw(st.sampled_from(sorted(m.jobs)))]
        if j.state in ("failed", "cancelled"):
            assert self.q("SELECT pgq.retry(%s)", (j.id,)) is True
            # Its dependants cancelled with it stay cancelled; a cancelled dependant runs now.
            j.state, j.run_at, j.last_event = "pending", (m.now, m.tick()), "retried"
            j.max_attempts = max(j.max_attempts, j.attempt + 1)
            self.retried = j.id
            EXERCISED["retried"] += 1
        else:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                self.conn.execute("SELECT pgq.retry(%s)", (j.id,))

    @precondition(lambda self: self.model.jobs)
    @rule(data=st.data(), really=st.integers(0, 2))
    def cancel(self, data: st.DataObject, really: int) -> None:
        if really:  # cancel as often as the other rules would end most runs early
            return
        j = self.model.jobs[data.draw(st.sampled_from(sorted(self.model.jobs)))]
        answer = self.q("SELECT pgq.cancel(%s)", (j.id,))
        if j.state in TERMINAL:
            assert answer is False
        else:
            assert answer is True
            EXERCISED["cancelled" if j.state != "waiting" else "cancelled while waiting"] += 1
            j.state, j.lease_until, j.last_event = "cancelled", None, "cancelled"
            self.model.ended(j)

    # Invariants ---------------------------------------------------------------------------------

    @invariant()
    def the_database_matches_the_model(self) -> None:
        cur = self.conn.execute(
            "SELECT id, state::text, attempt, max_attempts, last_event, priority,"
            " extract(epoch FROM lease_until - pgq._now()) / 60, extract(epoch FROM run_at - pgq._now()) / 60,"
            " (SELECT count(*) FROM pgq.job_events AS e WHERE e.job_id = j.id AND e.event = 'completed'),"
            " finished_at IS NOT NULL, dependencies_left, result, last_error, finished_at"
            " FROM pgq.jobs AS j ORDER BY id")
        rows = cur.fetchall()
        m = self.model
        # (a) every job is in a valid state, and none went missing or appeared.
        assert [r[0] for r in rows] == sorted(m.jobs)
        for (job_id, state, attempt, max_attempts, last_event, priority, lease_left, run_at_left,
             completions, finished, dependencies_left, *rest) in rows:
            j = m.jobs[job_id]
            assert (state, attempt, max_attempts, last_event, priority) == (
                j.state, j.attempt, j.max_attempts, j.last_event, j.priority), job_id
            # (b) at most one successful completion per job, and only from its running attempt.
            assert completions == j.completions <= 1
            assert finished == (state in TERMINAL)
            if state == "waiting":
                assert dependencies_left == len(j.waiting_for) > 0, job_id
            if state == "running":
                assert j.lease_until is not None
                assert abs(float(lease_left) - (j.lease_until - m.now)) < 0.5
            else:
                assert lease_left is None
            if state == "pending" and j.run_at[0] > 0:
                assert abs(float(run_at_left) - (j.run_at[0] - m.now)) < 0.5
            # (d) the attempt never exceeds max_attempts and never decreases.
            assert 0 <= attempt <= max_attempts
            assert attempt >= (self.previous.get(job_id, (None, 0))[1] or 0)
            # (e) terminal rows change only through an explicit admin call (here: retry).
            before = self.previous.get(job_id)
            row = (state, attempt, max_attempts, last_event, *rest)
            if before is not None and before[0] in TERMINAL and self.retried != job_id:
                assert row == before, job_id
            self.previous[job_id] = row
        # (c) every accepted owner operation came from the attempt that held the job.
        assert self.q(
            "SELECT count(*) FROM pgq.job_events AS e WHERE e.event IN ('completed', 'failed', 'snoozed',"
            " 'released', 'marked_unknown') AND e.attempt IS DISTINCT FROM (SELECT c.attempt FROM"
            " pgq.job_events AS c WHERE c.job_id = e.job_id AND c.event = 'claimed' AND c.id < e.id"
            " ORDER BY c.id DESC LIMIT 1)") == 0
        # (f) after a sweep, no running job holds an expired lease.
        if self.swept:
            assert self.q("SELECT count(*) FROM pgq.jobs WHERE state = 'running' AND lease_until < pgq._now()") == 0
        # The open links are exactly the waiting jobs' dependencies not done yet.
        links = set(self.conn.execute("SELECT job_id, depends_on FROM pgq.job_dependencies").fetchall())
        assert links == {(j.id, d) for j in m.jobs.values() for d in j.waiting_for}
        self.retried, self.swept = None, False


@pytest.mark.slow
def test_the_sql_api_behaves_like_the_model_queue_step_by_step(dsn: str, conn: psycopg.Connection) -> None:
    install_test_clock(conn)
    # A small step, so that a few jobs make a cascade longer than one call's share (test database only).
    conn.execute(f"CREATE OR REPLACE FUNCTION pgq._dependency_step() RETURNS integer LANGUAGE sql STABLE "
                 f"AS $$ SELECT {STEP} $$")
    conn.execute("SELECT pgq.configure_queue('q', lease => make_interval(mins => %s), "
                 "backoff_base => make_interval(mins => %s), backoff_cap => make_interval(mins => %s))",
                 (LEASE_MIN, RETRY_MIN, RETRY_MIN))
    QueueMachine.dsn = dsn
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(max_examples=200, stateful_step_count=50, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    missing = {"claimed", "renewed", "stale renew rejected", "completed", "stale complete rejected",
               "failed, now pending", "failed, now failed", "lease expired, now pending",
               "lease expired, now failed", "retried", "cancelled", "enqueued waiting",
               "released by the last dependency", "cancelled with its dependency",
               "enqueued cancelled: a dependency had ended", "enqueued pending: its dependencies were done",
               "cancelled while waiting", "an end left dependants to the backlog",
               "the sweep moved dependants on from the backlog",
               "an end in a recovery left its dependants to the sweep", "all_ended: enqueued waiting",
               "all_ended: counted a dependency that ended failed",
               "all_ended: counted a dependency that ended cancelled",
               "all_ended: enqueued pending, its dependencies had ended"} - set(EXERCISED)
    assert not missing, f"the runs never reached: {sorted(missing)} ({dict(EXERCISED)})"


