"""Durable execution from Python (issue 39): one method per SQL function on Client and AsyncClient
alike (each test runs over both), with typed answers and the "not yours" answers of the owner
calls (None, False, nothing), and enqueue's start_by and max_lifetime."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgq_thin import InvalidArgument, JobNotFound, JobOutcome, SignalAnswer, SleepAnswer, StepLookup, StepRecord
from pgq_thin.errors import BadArgumentType

from clientkit import clients
from sqlhelpers import expire_lease, one


def test_steps_and_their_not_yours_answers(dsn, client_kind):
    with clients(client_kind, dsn) as client:
        job_id = client.enqueue("q", "k")
        [job] = client.claim("w", ["q"])
        assert client.get_steps(job_id, job.attempt) == {}
        assert client.get_step(job_id, job.attempt, "charge") == StepLookup(False, None)
        assert client.record_step(job_id, job.attempt, "charge", {"receipt": "r-1"}) is True
        assert client.record_step(job_id, job.attempt, "notify", None) is True      # a JSON null
        assert client.get_step(job_id, job.attempt, "charge") == StepLookup(True, {"receipt": "r-1"})
        assert client.get_steps(job_id, job.attempt) == {"charge": {"receipt": "r-1"}, "notify": None}
        steps = client.job_steps(job_id)
        assert [(s.name, s.attempt, s.result) for s in steps] == [
            ("charge", 1, {"receipt": "r-1"}), ("notify", 1, None)]
        assert isinstance(steps[0], StepRecord)
        # A stale attempt: every owner call answers "not yours".
        with psycopg.connect(dsn, autocommit=True) as su:
            expire_lease(su, job_id)
        [again] = client.claim("w", ["q"])
        stale = job.attempt
        assert client.get_step(job_id, stale, "charge") is None
        assert client.get_steps(job_id, stale) == {}
        assert client.record_step(job_id, stale, "late", 1) is False
        assert client.sleep(job_id, stale, "nap", 60) is None
        assert client.await_signal(job_id, stale, "go") is None
        assert client.spawn(job_id, stale, "kid", "kids", "child") is None
        assert client.await_jobs(job_id, stale, [424242]) is None
        assert client.job_outcomes(job_id, stale, [job_id]) == []
        assert client.get_steps(job_id, again.attempt) == {"charge": {"receipt": "r-1"}, "notify": None}


def test_a_signal_wait_a_sleep_children_and_a_workflow_cancelled(dsn, client_kind):
    with clients(client_kind, dsn) as client:
        root = client.enqueue("q", "k")
        [job] = client.claim("w", ["q"])
        assert client.await_signal(root, job.attempt, "go", timeout=timedelta(hours=1)) == SignalAnswer("waiting", None)
        assert client.signal("q", "go", {"by": "ann"}) == 1
        assert client.signal("q", "go") == 0
        [job] = client.claim("w", ["q"])
        assert client.await_signal(root, job.attempt, "go") == SignalAnswer("arrived", {"by": "ann"})
        kid = client.spawn(root, job.attempt, "kid", "kids", "child", {"n": 1})
        assert client.spawn(root, job.attempt, "kid", "kids", "child") == kid
        assert client.await_jobs(root, job.attempt, [kid]) == "waiting"
        [child] = client.claim("w", ["kids"])
        assert client.complete(kid, child.attempt, {"made": 1})
        [job] = client.claim("w", ["q"])
        assert client.await_jobs(root, job.attempt, [kid]) == "ended"
        [outcome] = client.job_outcomes(root, job.attempt, [kid])
        assert outcome == JobOutcome(kid, "done", {"made": 1}, None, outcome.finished_at)
        asleep = client.sleep(root, job.attempt, "nap", 3600)
        assert isinstance(asleep, SleepAnswer) and asleep.status == "sleeping"
        record = client.get_job(kid)
        assert (record.workflow_id, record.parent_id) == (root, root)
        assert client.cancel_workflow(kid) == 1                  # the sleeping root
        assert client.get_job(root).state == "cancelled"
        with pytest.raises(JobNotFound):
            client.cancel_workflow(424242)


def test_enqueue_takes_start_by_and_max_lifetime(dsn, client_kind):
    with clients(client_kind, dsn) as client:
        soon = datetime.now(timezone.utc) + timedelta(hours=1)
        job_id = client.enqueue("q", "k", start_by=soon, max_lifetime=timedelta(days=2))
        record = client.get_job(job_id)
        assert record.start_by == soon
        assert record.expires_at is not None and record.expires_at - record.created_at >= timedelta(days=2)
        with pytest.raises(InvalidArgument) as info:
            client.enqueue("q", "k", start_by=datetime.now(timezone.utc) - timedelta(hours=1))
        assert 'argument "start_by"' in str(info.value)
        with pytest.raises(BadArgumentType):
            client.enqueue("q", "k", start_by="tomorrow")


def test_a_step_recorded_with_the_callers_connection_commits_with_its_writes(dsn):
    from pgq_thin import Client

    with Client(dsn) as client, psycopg.connect(dsn) as mine:
        mine.execute("CREATE TABLE public.charges (cents integer)")
        mine.commit()
        job_id = client.enqueue("q", "k")
        [job] = client.claim("w", ["q"])
        mine.execute("INSERT INTO public.charges VALUES (42)")
        assert client.record_step(job_id, job.attempt, "charge", {"cents": 42}, conn=mine) is True
        mine.rollback()
        assert client.get_steps(job_id, job.attempt) == {}
        mine.execute("INSERT INTO public.charges VALUES (42)")
        assert client.record_step(job_id, job.attempt, "charge", {"cents": 42}, conn=mine) is True
        mine.commit()
        assert client.get_steps(job_id, job.attempt) == {"charge": {"cents": 42}}
        assert one(mine, "SELECT count(*) FROM public.charges") == 1
