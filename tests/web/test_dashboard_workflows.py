"""The dashboard's view of workflows (issue 26), over Starlette's TestClient on a real database with
real logins: the job page and /api/jobs/{id} show a job's dependencies and dependants (pgq.job_links:
ids linked to their pages, states, the first 100 of each and a note when there are more), its
dependency_mode and its batch (linked); the batch page and /api/batches/{id} show pgq.batch_status
(state, counts, callback, the callback job linked once enqueued) before and after sealing and after
the callback; unknown and malformed ids get 404 and 400 as /api/jobs/{id} does; the pages read with
the dashboard's login (a producer login that did not open the batch is answered as for an unknown id)
behind the token."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgq_thin import Client
from pgq_thin.dashboard.app import LINKS_SHOWN

from dashboardkit import close_batch, dashboard, enqueue_linked, finish, logins, open_batch


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


@pytest.fixture
def producer(pgq_dsn: str) -> Iterator[str]:
    """A LOGIN role in pgq_producer (not pgq_monitor): the DSN that logs in as it."""
    name = f"dash_producer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pgq_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE pgq_producer")
    try:
        yield make_conninfo(pgq_dsn, user=name)
    finally:
        with psycopg.connect(pgq_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")


def assert_error(response: Any, status: int, sqlstate: str | None, *words: str) -> None:
    """A JSON error of the API's shape, naming ``words``, never a traceback (as test_dashboard_api's)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["sqlstate"] == sqlstate, body
    for word in words:
        assert word in body["error"], body
    assert "Traceback" not in response.text


def linked(answer: dict[str, Any], relation: str) -> list[tuple[int, str | None]]:
    return [(r["job_id"], r["state"]) for r in answer["links"][relation]]


def test_a_job_shows_its_dependencies_dependants_and_mode(pgq_client: Client, roles: dict[str, str]) -> None:
    dsn = pgq_client.dsn
    first, second = enqueue_linked(dsn, "work", "fetch", count=2)
    [fan_in] = enqueue_linked(dsn, "work", "merge", depends_on=[first, second], dependency_mode="all_ended")
    [after] = enqueue_linked(dsn, "work", "publish", depends_on=[fan_in])
    finish(pgq_client, "work", ["failed"])  # the first: all_ended still waits for the second
    with dashboard(roles["pgq_monitor"]) as http:
        answer = http.get(f"/api/jobs/{fan_in}").json()
        assert answer["job"]["dependency_mode"] == "all_ended" and answer["job"]["batch_id"] is None
        assert linked(answer, "dependencies") == [(first, "failed"), (second, "pending")]
        assert linked(answer, "dependants") == [(after, "waiting")]
        assert answer["links"]["dependencies"][0] | {"job_id": 0} == {
            "job_id": 0, "queue": "work", "kind": "fetch", "state": "failed"}
        assert (answer["links"]["more_dependencies"], answer["links"]["more_dependants"]) == (False, False)

        page = http.get(f"/jobs/{fan_in}").text
        assert '<dd id="dependency-mode">all_ended</dd>' in page and '<dd id="batch">-</dd>' in page
        for job_id in (first, second, after):
            assert f'<a href="/jobs/{job_id}">{job_id}</a>' in page
        assert '<span class="state failed">failed</span>' in page
        assert '<span class="state waiting">waiting</span>' in page
        assert "there are more" not in page

        # The first: no dependencies, one dependant; no dependency_mode (not enqueued with depends_on).
        answer = http.get(f"/api/jobs/{first}").json()
        assert answer["job"]["dependency_mode"] is None
        assert (linked(answer, "dependencies"), linked(answer, "dependants")) == ([], [(fan_in, "waiting")])
        page = http.get(f"/jobs/{first}").text
        assert '<p class="empty" id="dependencies">None.</p>' in page
        assert '<dd id="dependency-mode">-</dd>' in page

    finish(pgq_client, "work", ["done"])  # the second ends: the fan-in is released
    with dashboard(roles["pgq_monitor"]) as http:
        answer = http.get(f"/api/jobs/{after}").json()
        assert answer["job"]["dependency_mode"] == "all_done"
        assert linked(answer, "dependencies") == [(fan_in, "pending")]


def test_the_first_100_of_each_relation_and_a_note_that_there_are_more(pgq_client: Client) -> None:
    dsn = pgq_client.dsn
    many = LINKS_SHOWN + 1
    dependencies = enqueue_linked(dsn, "work", "part", count=many)
    [hub] = enqueue_linked(dsn, "work", "hub", depends_on=dependencies)
    dependants = enqueue_linked(dsn, "work", "leaf", depends_on=[hub], count=many)
    exact = enqueue_linked(dsn, "work", "leaf", depends_on=dependencies[:LINKS_SHOWN])[0]
    with dashboard(dsn) as http:
        links = http.get(f"/api/jobs/{hub}").json()["links"]
        assert [r["job_id"] for r in links["dependencies"]] == dependencies[:LINKS_SHOWN]
        assert [r["job_id"] for r in links["dependants"]] == dependants[:LINKS_SHOWN]
        assert (links["more_dependencies"], links["more_dependants"]) == (True, True)
        page = http.get(f"/jobs/{hub}").text
        assert f'<p class="more" id="dependencies-more">The first {LINKS_SHOWN} are shown of {many}: there are more.' \
               in page
        assert f'<p class="more" id="dependants-more">The first {LINKS_SHOWN} are shown: there are more.' in page
        assert f'href="/jobs/{dependencies[LINKS_SHOWN - 1]}"' in page
        assert f'href="/jobs/{dependencies[LINKS_SHOWN]}"' not in page
        assert f'href="/jobs/{dependants[LINKS_SHOWN]}"' not in page

        links = http.get(f"/api/jobs/{exact}").json()["links"]  # exactly 100: nothing more to say
        assert len(links["dependencies"]) == LINKS_SHOWN and links["more_dependencies"] is False
        assert "there are more" not in http.get(f"/jobs/{exact}").text


def test_a_batch_before_and_after_sealing_and_after_its_callback(pgq_client: Client, roles: dict[str, str]) -> None:
    dsn = pgq_client.dsn
    batch = open_batch(dsn, "after", "report", "all_ended")
    members = enqueue_linked(dsn, "work", "member", batch=batch, count=3)
    with dashboard(roles["pgq_monitor"]) as http:
        answer = http.get(f"/api/batches/{batch}")
        assert answer.status_code == 200, answer.text
        status = answer.json()["batch"]
        assert status["batch_id"] == batch and status["state"] == "open" and status["sealed_at"] is None
        counts = {k: status[k] for k in ("members", "unfinished", "done", "failed", "cancelled")}
        assert counts == {"members": 3, "unfinished": 3, "done": 0, "failed": 0, "cancelled": 0}
        assert (status["callback_queue"], status["callback_kind"], status["run_when"]) == ("after", "report",
                                                                                          "all_ended")
        assert status["callback_job_id"] is None

        # The member's page links to its batch; the batch page shows the counts, no callback job yet.
        member = http.get(f"/jobs/{members[0]}").text
        assert f'<dd id="batch"><a href="/batches/{batch}">batch {batch}</a></dd>' in member
        assert http.get(f"/api/jobs/{members[0]}").json()["job"]["batch_id"] == batch
        page = http.get(f"/batches/{batch}").text
        assert '<span id="batch-state"><span class="state open">open</span></span>' in page
        assert '<td class="num" data-col="members">3</td>' in page
        assert '<td class="num" data-col="unfinished">3</td>' in page
        assert '<dd id="callback-job">not enqueued yet</dd>' in page
        assert "not yet: members may still be added" in page
        assert '<a href="/jobs?queue=after">after</a>' in page and '<dd id="callback-kind">report</dd>' in page

        # Two members end, then the batch is sealed: sealed, one unfinished, still no callback.
        finish(pgq_client, "work", ["done", "failed"])
        assert close_batch(dsn, batch) is True
        status = http.get(f"/api/batches/{batch}").json()["batch"]
        assert (status["state"], status["unfinished"], status["done"], status["failed"]) == ("sealed", 1, 1, 1)
        assert status["sealed_at"] is not None and status["callback_job_id"] is None
        page = http.get(f"/batches/{batch}").text
        assert '<span class="state sealed">sealed</span>' in page and "not enqueued yet" in page

        # The last member ends: the callback is enqueued (all_ended: whatever the outcomes), linked.
        finish(pgq_client, "work", ["done"])
        status = http.get(f"/api/batches/{batch}").json()["batch"]
        assert (status["state"], status["unfinished"], status["done"], status["failed"]) == ("finished", 0, 2, 1)
        callback = status["callback_job_id"]
        assert isinstance(callback, int) and status["finished_at"] is not None
        page = http.get(f"/batches/{batch}").text
        assert f'<dd id="callback-job"><a href="/jobs/{callback}">job {callback}</a></dd>' in page
        assert '<td class="num" data-col="done">2</td>' in page and '<td class="num" data-col="failed">1</td>' in page
        job = http.get(f"/api/jobs/{callback}").json()["job"]
        assert (job["queue"], job["kind"], job["state"]) == ("after", "report", "pending")
        assert job["meta"]["batch"] == {"id": batch, "members": 3, "done": 2, "failed": 1, "cancelled": 0}


def test_an_all_done_batch_with_a_failure_shows_its_cancelled_callback(pgq_client: Client) -> None:
    dsn = pgq_client.dsn
    batch = open_batch(dsn, "after", "report", "all_done")
    enqueue_linked(dsn, "work", "member", batch=batch, count=2)
    assert close_batch(dsn, batch) is True
    finish(pgq_client, "work", ["done", "failed"])
    with dashboard(dsn) as http:
        status = http.get(f"/api/batches/{batch}").json()["batch"]
        assert (status["state"], status["run_when"]) == ("finished", "all_done")
        callback = status["callback_job_id"]
        assert http.get(f"/api/jobs/{callback}").json()["job"]["state"] == "cancelled"
        page = http.get(f"/batches/{batch}").text
        assert "(cancelled if a member failed or was cancelled)" in page
        assert f'<a href="/jobs/{callback}">job {callback}</a>' in page


def test_the_batch_page_lists_its_members_and_finds_the_failed_one(pgq_client: Client) -> None:
    # Issue 42: a batch of many members, one failed: the members heading links to each state's
    # members; the failed ones are that one member.
    dsn = pgq_client.dsn
    batch = open_batch(dsn, "after", "report", "all_ended")
    members = enqueue_linked(dsn, "work", "member", batch=batch, count=60)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgq.jobs SET state = 'failed', finished_at = now(), last_error = 'boom <b>' WHERE id = %s",
                     (members[7],))
    with dashboard(dsn) as http:
        page = http.get(f"/batches/{batch}").text
        assert f'<a href="/jobs/{members[-1]}">{members[-1]}</a>' in page  # the newest first
        assert f'<a href="/jobs/{members[0]}">' not in page  # beyond the first 50
        assert f"before={members[-50]}" in page  # the next page's link
        failed = http.get(f"/batches/{batch}?state=failed").text
        assert f'<a href="/jobs/{members[7]}">{members[7]}</a>' in failed
        assert failed.count('<a href="/jobs/') == 1 and "boom &lt;b&gt;" in failed
        assert '<a href="?state=failed#members">failed</a>' in page
        older = http.get(f"/batches/{batch}?before={members[-50]}").text
        assert f'<a href="/jobs/{members[0]}">{members[0]}</a>' in older


def test_a_cancelled_batch(pgq_client: Client) -> None:
    dsn = pgq_client.dsn
    batch = open_batch(dsn)
    members = enqueue_linked(dsn, "work", "member", batch=batch, count=2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pgq.cancel_batch(id => %s)", (batch,)).fetchone() == (2,)
    with dashboard(dsn) as http:
        status = http.get(f"/api/batches/{batch}").json()["batch"]
        assert (status["state"], status["cancelled"], status["unfinished"]) == ("cancelled", 2, 0)
        page = http.get(f"/batches/{batch}").text
        assert '<span class="state cancelled">cancelled</span>' in page
        assert '<td class="num" data-col="cancelled">2</td>' in page
        callback = status["callback_job_id"]  # every member ended: the callback, enqueued already cancelled
        assert http.get(f"/api/jobs/{callback}").json()["job"]["state"] == "cancelled"
        assert f'<a href="/jobs/{callback}">job {callback}</a>' in page
        member = http.get(f"/jobs/{members[0]}").text
        assert f'<a href="/batches/{batch}">batch {batch}</a>' in member and "state cancelled" in member


def test_an_empty_sealed_batch_has_its_callback_at_once(pgq_client: Client) -> None:
    batch = open_batch(pgq_client.dsn)
    close_batch(pgq_client.dsn, batch)
    with dashboard(pgq_client.dsn) as http:
        status = http.get(f"/api/batches/{batch}").json()["batch"]
    assert (status["state"], status["members"], status["unfinished"]) == ("finished", 0, 0)
    assert status["callback_job_id"] is not None


def test_unknown_and_malformed_ids(pgq_client: Client, roles: dict[str, str]) -> None:
    with dashboard(roles["pgq_monitor"]) as http:
        assert_error(http.get("/api/batches/987654"), 404, "P0002", "987654")
        assert_error(http.get("/api/batches/abc"), 400, None, "batch id", "'abc'")
        assert_error(http.get("/api/batches/0"), 400, None, "batch id")
        assert_error(http.get("/api/batches/99999999999999999999"), 400, None, "batch id")
        assert_error(http.get("/api/batches/1.5"), 400, None, "batch id")
        assert_error(http.get("/api/jobs/987654"), 404, "P0002", "987654")
        page = http.get("/batches/987654")
        assert page.status_code == 404 and "SQLSTATE P0002" in page.text and "Traceback" not in page.text
        page = http.get("/batches/<b>x")
        assert page.status_code == 400 and "batch id" in page.text and "&lt;b&gt;x" in page.text
        assert "<b>x" not in page.text
        assert http.get("/batches/").status_code == 404


def test_the_pages_read_with_the_dashboards_login_behind_the_token(
        pgq_client: Client, roles: dict[str, str], producer: str) -> None:
    batch = open_batch(pgq_client.dsn)
    [member] = enqueue_linked(pgq_client.dsn, batch=batch)
    # A producer login that did not open the batch may not read it: answered as an unknown id.
    with dashboard(producer) as http:
        assert_error(http.get(f"/api/batches/{batch}"), 404, "P0002", str(batch))
    # The login that opened it reads its batch (pgq.batch_status is the opener's too).
    own = open_batch(producer)
    with dashboard(producer) as http:
        assert http.get(f"/api/batches/{own}").json()["batch"]["opened_by"] == conninfo_to_dict(producer)["user"]
    with dashboard(roles["pgq_monitor"], token="s3cret") as http:
        for url in (f"/api/batches/{batch}", f"/api/jobs/{member}"):
            assert http.get(url).status_code == 401
            assert http.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        form = http.get(f"/batches/{batch}")
        assert form.status_code == 401 and 'name="token"' in form.text and f"/batches/{batch}" in form.text
        assert http.get(f"/batches/{batch}", headers={"Authorization": "Bearer s3cret"}).status_code == 200



def test_the_job_page_works_on_a_database_without_job_links(pgq_client: Client) -> None:
    """A dashboard newer than the database's schema (pgq.job_links is migration 0017's): the job page
    and /api/jobs/{id} still answer, saying the links are not there (null in the API)."""
    job_id = pgq_client.enqueue("mail", "send", {})
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgq.job_links(bigint, integer)")
    with dashboard(pgq_client.dsn) as http:
        answer = http.get(f"/api/jobs/{job_id}")
        assert answer.status_code == 200 and answer.json()["links"] is None
        page = http.get(f"/jobs/{job_id}")
        assert page.status_code == 200 and 'id="no-links"' in page.text and "migration 0017" in page.text
