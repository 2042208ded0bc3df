"""The dashboard's view of durable execution (issue 39), over Starlette's TestClient on a real
database, read by a pgq_monitor login: a job's page and /api/jobs/{id} show its recorded steps
(pgq.job_steps, by name, the first 100 and a note when there are more), the signal it waits for and
until when, the jobs it spawned (children) and awaits, its parent and its workflow's root, and its
start_by and expires_at."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from pgq_thin import Client
from pgq_thin.dashboard.app import STEPS_SHOWN

from dashboardkit import dashboard, logins


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


def linked(answer: dict[str, Any], relation: str) -> list[tuple[int, str | None]]:
    return [(r["job_id"], r["state"]) for r in answer["links"][relation]]


def test_a_job_shows_its_steps_children_awaited_jobs_and_parent(pgq_client: Client, roles: dict[str, str]) -> None:
    root = pgq_client.enqueue("orders", "fulfil", max_lifetime=timedelta(days=3))
    [job] = pgq_client.claim("w", ["orders"])
    assert pgq_client.record_step(root, job.attempt, "reserve", {"reservation": "<b>r-17</b>"})
    kids = [pgq_client.spawn(root, job.attempt, f"part-{n}", "parts", "make_part") for n in range(2)]
    assert pgq_client.await_jobs(root, job.attempt, kids) == "waiting"
    with dashboard(roles["pgq_monitor"]) as http:
        answer = http.get(f"/api/jobs/{root}").json()
        assert [s["name"] for s in answer["steps"]["rows"]] == ["part-0", "part-1", "reserve"]
        assert answer["steps"]["rows"][2]["result"] == {"reservation": "<b>r-17</b>"}
        assert answer["steps"]["more"] is False
        assert linked(answer, "children") == [(kids[0], "pending"), (kids[1], "pending")]
        assert linked(answer, "awaiting") == [(kids[0], "pending"), (kids[1], "pending")]
        assert linked(answer, "parent") == []
        page = http.get(f"/jobs/{root}").text
        assert '<table id="steps">' in page and '<tr data-step="reserve">' in page
        assert "&lt;b&gt;r-17&lt;/b&gt;" in page and "<b>r-17</b>" not in page
        assert '<table id="children">' in page and '<table id="awaiting">' in page
        assert f'<a href="/jobs/{kids[1]}">{kids[1]}</a>' in page
        assert '<dd id="waits-for">2 awaited job(s) to end</dd>' in page
        assert '<dd id="expires-at">-</dd>' not in page and '<dd id="workflow">-</dd>' in page

        child = http.get(f"/api/jobs/{kids[0]}").json()
        assert linked(child, "parent") == [(root, "waiting")]
        assert child["job"]["workflow_id"] == root and child["job"]["parent_id"] == root
        child_page = http.get(f"/jobs/{kids[0]}").text
        assert f'<dd id="workflow"><a href="/jobs/{root}">job {root}</a> (its root)</dd>' in child_page
        assert '<table id="parent">' in child_page
        assert '<p class="empty" id="steps">None recorded.</p>' in child_page


def test_a_job_waiting_for_a_signal_shows_it_and_when_its_wait_times_out(pgq_client: Client,
                                                                        roles: dict[str, str]) -> None:
    job_id = pgq_client.enqueue("orders", "fulfil")
    [job] = pgq_client.claim("w", ["orders"])
    assert pgq_client.await_signal(job_id, job.attempt, "approved:7", timeout=timedelta(days=2)).status == "waiting"
    forever = pgq_client.enqueue("orders", "fulfil")
    [job2] = pgq_client.claim("w", ["orders"])
    assert pgq_client.await_signal(forever, job2.attempt, "approved:8").status == "waiting"
    with dashboard(roles["pgq_monitor"]) as http:
        answer = http.get(f"/api/jobs/{job_id}").json()
        assert (answer["job"]["wait_signal"], answer["job"]["state"]) == ("approved:7", "waiting")
        assert answer["job"]["wake_at"] is not None
        page = http.get(f"/jobs/{job_id}").text
        assert '<dd id="waits-for">signal <code>approved:7</code> until ' in page
        assert "(no timeout)" in http.get(f"/jobs/{forever}").text
        pgq_client.signal("orders", "approved:7", {"by": "ann"})
        woken = http.get(f"/jobs/{job_id}").text
        assert '<dd id="waits-for">-</dd>' in woken
        [again] = [j for j in pgq_client.claim("w", ["orders"]) if j.id == job_id]
        assert pgq_client.await_signal(job_id, again.attempt, "approved:7").status == "arrived"
        steps = http.get(f"/api/jobs/{job_id}").json()["steps"]["rows"]
        assert [(s["name"], s["result"]) for s in steps] == [
            ("signal:approved:7", {"status": "arrived", "payload": {"by": "ann"}})]


def test_the_first_100_steps_and_a_note_that_there_are_more(pgq_client: Client) -> None:
    job_id = pgq_client.enqueue("loops", "charge")
    [job] = pgq_client.claim("w", ["loops"])
    for n in range(STEPS_SHOWN + 1):
        assert pgq_client.record_step(job_id, job.attempt, f"charge#{n:03d}", n)
    with dashboard(pgq_client.dsn) as http:
        steps = http.get(f"/api/jobs/{job_id}").json()["steps"]
        assert len(steps["rows"]) == STEPS_SHOWN and steps["more"] is True
        assert steps["rows"][-1]["name"] == f"charge#{STEPS_SHOWN - 1:03d}"
        page = http.get(f"/jobs/{job_id}").text
        assert f'<p class="more" id="steps-more">The first {STEPS_SHOWN} are shown, by name: there are more.' in page
