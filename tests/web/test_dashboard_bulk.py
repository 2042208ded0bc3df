"""The job list's "retry all shown" and "cancel all shown" (issue 27), over Starlette's TestClient on a
real database with real logins: the button appears for one queue and a state it applies to, states
the count in its label and its confirmation, and its POST (/api/jobs/retry-all, /api/jobs/cancel-all)
acts through pgq.retry_jobs / pgq.cancel_jobs on at most that many jobs, only on those there when
the page was made; a pgq_monitor login sees it disabled and is refused; bad bodies get 400 with the
reason; a schema without the functions shows no button (501 to a POST)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.dashboard.app import BULK_MAX, create_app
from pgq_thin.errors import BadArgument, JobNotFound

from dashboardkit import dashboard, failed_job, logins

OWN = "http://testserver"  # the TestClient's origin


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


def assert_error(response: Any, status: int, sqlstate: str | None, *words: str) -> None:
    """A JSON error of the API's shape, naming ``words``, never a traceback (as test_dashboard_api's)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["sqlstate"] == sqlstate, body
    for word in words:
        assert word in body["error"], body
    assert "Traceback" not in response.text


def bulk_buttons(http: TestClient, query: str) -> dict[str, dict[str, Any]]:
    """The list page's bulk buttons by verb (retry, cancel, delete): each one's label, URL,
    confirmation, body (parsed) and whether it is disabled."""
    page = http.get(f"/jobs?{query}")
    assert page.status_code == 200, page.text
    found = re.search(r'<p class="actions" id="bulk">(.*?)\n<small>', page.text, re.S)
    if found is None:
        assert 'id="bulk"' not in page.text
        return {}
    buttons = {}
    for attrs, label in re.findall(r'<button class="action" ([^>]*)>([^<]*)</button>', found.group(1)):
        attributes = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', attrs)}
        buttons[label.split()[0]] = {
            "label": label, "url": attributes["data-url"], "confirm": attributes["data-confirm"],
            "body": json.loads(attributes["data-body"]), "disabled": "disabled" in attrs,
            "title": attributes.get("title")}
    assert buttons, found.group(1)
    return buttons


def bulk_button(http: TestClient, query: str, verb: str | None = None) -> dict[str, Any] | None:
    """The list page's "retry all shown" or "cancel all shown" button (or the ``verb`` one); None
    when the page has none."""
    buttons = bulk_buttons(http, query)
    if verb is not None:
        return buttons.get(verb)
    return buttons.get("retry") or buttons.get("cancel")


def press(http: TestClient, button: dict[str, Any]) -> Any:
    """What the page's script sends when the button is confirmed."""
    return http.post(button["url"], content=json.dumps(button["body"]), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(("verb", "warning", "done"), [
    ("retry", "", "retried"),
    ("delete", " They are gone for good, with their history.", "deleted"),  # issue 41
])
def test_retry_or_delete_all_shown_states_the_count_and_acts_on_the_jobs_that_were_shown(
        pgq_client: Client, roles: dict[str, str], verb: str, warning: str, done: str) -> None:
    shown = [failed_job(pgq_client) for _ in range(3)]
    other_queue = failed_job(pgq_client, queue="billing")
    with dashboard(roles["pgq_admin"]) as http:
        buttons = bulk_buttons(http, "queue=mail&state=failed")
        assert list(buttons) == ["retry", "delete"]  # both apply to failed jobs
        button = buttons[verb]
        assert not button["disabled"] and button["label"] == f"{verb} all shown (3)"
        assert button["confirm"] == f"{verb.capitalize()} all 3 failed jobs of queue mail?{warning}"
        assert button["url"] == f"/api/jobs/{verb}-all"
        assert {k: button["body"][k] for k in ("queue", "state", "kind", "tags", "max_jobs")} == {
            "queue": "mail", "state": "failed", "kind": None, "tags": None, "max_jobs": 3}
        late = failed_job(pgq_client)  # failed after the page was made: not one of those shown
        answer = press(http, button)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"ok": True, "count": 3, "detail": f"{done} 3 failed job(s) of queue mail"}
        assert bulk_button(http, "queue=mail&state=failed", verb)["label"] == f"{verb} all shown (1)"  # type: ignore[index]
    assert pgq_client.get_job(late).state == "failed" and pgq_client.get_job(other_queue).state == "failed"
    if verb == "retry":
        assert [pgq_client.get_job(i).state for i in shown] == ["pending"] * 3
        assert [e.event for e in pgq_client.job_history(shown[0])][-1] == "retried"
    else:
        for job_id in shown:
            with pytest.raises(JobNotFound):
                pgq_client.get_job(job_id)


def test_cancel_all_shown_counts_a_kinds_jobs_through_pages_and_acts_on_at_most_that_many(
        pgq_client: Client, roles: dict[str, str]) -> None:
    kind_a = pgq_client.enqueue_many("mail", "a", [{}] * 1203)
    kind_b = pgq_client.enqueue_many("mail", "b", [{}] * 2)
    with dashboard(roles["pgq_admin"]) as http:
        button = bulk_button(http, "queue=mail&state=pending&kind=a")
        assert button is not None
        assert button["label"] == "cancel all shown (1203)"
        assert button["confirm"] == "Cancel all 1203 pending jobs of queue mail of kind a?"
        assert (button["url"], button["body"]["kind"], button["body"]["max_jobs"]) == (
            "/api/jobs/cancel-all", "a", 1203)
        fewer = press(http, {**button, "body": {**button["body"], "max_jobs": 1001}})  # at most what it is told
        assert fewer.json()["count"] == 1001
        rest = press(http, button)
        assert rest.json() == {"ok": True, "count": 202,
                               "detail": "cancelled 202 pending job(s) of queue mail of kind a"}
        assert bulk_button(http, "queue=mail&state=pending&kind=a") is None  # nothing left to cancel
        assert bulk_button(http, "queue=mail&state=pending")["label"] == "cancel all shown (2)"  # type: ignore[index]
    assert {pgq_client.get_job(i).state for i in kind_a} == {"cancelled"}
    assert {pgq_client.get_job(i).state for i in kind_b} == {"pending"}


def test_the_button_is_shown_only_for_one_queue_and_a_state_it_applies_to(
        pgq_client: Client, roles: dict[str, str]) -> None:
    failed_job(pgq_client)
    pgq_client.enqueue("mail", "send", {})
    done = pgq_client.enqueue("mail", "other", {})
    [job] = pgq_client.claim("w", ["mail"], kinds=["other"])
    assert job.id == done and pgq_client.complete(job.id, job.attempt)
    with dashboard(roles["pgq_admin"]) as http:
        for query in ("", "state=failed", "queue=mail", "queue=mail&state=done", "queue=mail&state=cancelled",
                      "queue=mail&state=failed&kind=nothing"):
            assert bulk_button(http, query) is None, query
        assert bulk_button(http, "queue=mail&state=pending")["label"] == "cancel all shown (1)"  # type: ignore[index]


def test_more_than_a_click_takes_is_said_in_the_confirmation(pgq_client: Client, roles: dict[str, str]) -> None:
    many = BULK_MAX + 1005  # past what pages of 1000 count up to
    pgq_client.enqueue_many("mail", "a", [{}] * many)
    with dashboard(roles["pgq_admin"]) as http:
        button = bulk_button(http, "queue=mail&state=pending")
        # Of a kind, counted through pgq.list_jobs up to a page past the most a click takes.
        of_kind = bulk_button(http, "queue=mail&state=pending&kind=a")
    assert button is not None and button["body"]["max_jobs"] == BULK_MAX
    assert button["label"] == f"cancel all shown ({many})"
    assert button["confirm"] == (f"Cancel the {BULK_MAX} oldest of the {many} pending jobs of queue mail? "
                                 f"(at most {BULK_MAX} a click)")
    assert of_kind is not None and of_kind["body"]["max_jobs"] == BULK_MAX
    assert of_kind["label"] == f"cancel all shown (more than {BULK_MAX})"
    assert of_kind["confirm"] == (f"Cancel the {BULK_MAX} oldest of the more than {BULK_MAX} pending jobs of queue "
                                  f"mail of kind a? (at most {BULK_MAX} a click)")


def test_a_monitor_sees_the_button_disabled_and_is_refused(pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    with dashboard(roles["pgq_monitor"]) as http:
        buttons = bulk_buttons(http, "queue=mail&state=failed")
        assert list(buttons) == ["retry", "delete"]
        for function, button in zip(("retry_jobs", "delete_jobs"), buttons.values()):
            assert button["disabled"]
            assert button["title"].startswith("read-only: role dash_monitor_") and f"pgq.{function}" in button["title"]
            refused = press(http, button)
            assert_error(refused, 403, "42501", f"permission denied for function {function}")
            assert f"pgq.{function}" in refused.json()["hint"] and "pgq_admin" in refused.json()["hint"]
        cancel = {"url": "/api/jobs/cancel-all", "body": {"queue": "mail", "state": "pending", "max_jobs": 1}}
        refused = press(http, cancel)
        assert_error(refused, 403, "42501", "permission denied for function cancel_jobs")
        assert "read-only" in refused.json()["hint"] and "pgq.cancel_jobs" in refused.json()["hint"]
    assert pgq_client.get_job(job_id).state == "failed"


def test_bad_bodies_get_400_with_the_reason_and_change_nothing(pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    good = {"queue": "mail", "state": "failed", "kind": None, "before": None, "max_jobs": 5}
    with dashboard(roles["pgq_admin"]) as http:
        url = "/api/jobs/retry-all"
        assert_error(http.post(url, content=b"{nope", headers={"Content-Type": "application/json"}), 400, None,
                     "max_jobs")
        assert_error(http.post(url, json=[good]), 400, None, "the body must be")
        for change, words in [({"max_jobs": None}, ['"max_jobs"']), ({"max_jobs": 0}, ["from 1 to"]),
                              ({"max_jobs": BULK_MAX + 1}, ["from 1 to"]), ({"max_jobs": "5"}, ['"max_jobs"']),
                              ({"max_jobs": True}, ['"max_jobs"']), ({"queue": None}, ['"queue"']),
                              ({"state": 3}, ['"state"']), ({"kind": ["a"]}, ['"kind"']),
                              ({"before": "2026-12-05T14:00"}, ['"before"', "offset"]),
                              ({"before": "yesterday"}, ['"before"']),
                              ({"before": "5"}, ['"before"', "needs a unit"]),
                              ({"before": "99999999999d"}, ['"before"', "too long"]),
                              ({"before": "999999999d"}, ['"before"', "before the year 1"])]:
            assert_error(http.post(url, json={**good, **change}), 400, None, *words)
        # What pgq itself refuses: its message and SQLSTATE.
        assert_error(http.post(url, json={**good, "state": "done"}), 400, "22023", '"state"')
        assert_error(http.post(url, json={**good, "queue": "bad queue!"}), 400, "22023", '"queue"')
        assert_error(http.post("/api/jobs/cancel-all", json={**good, "state": "failed"}), 400, "22023", '"state"')
        refused = http.post(url, json=good, headers={"Origin": "http://evil.example"})
        assert refused.status_code == 403
    assert pgq_client.get_job(job_id).state == "failed"


def test_before_takes_a_duration_as_the_cli_does(pgq_client: Client, roles: dict[str, str]) -> None:
    """"before": "1h" means an hour before the database's clock now, as `pgq-thin retry --all
    --before 1h` (issue 42: durations one way everywhere); a login lasts ``session_lifetime``,
    which takes a duration too."""
    old, recent = failed_job(pgq_client), failed_job(pgq_client)
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgq.jobs SET finished_at = finished_at - interval '2 hours' WHERE id = %s", (old,))
    with dashboard(roles["pgq_admin"], session_lifetime="8h") as http:
        body = {"queue": "mail", "state": "failed", "before": "1h 30m", "max_jobs": 10}
        answer = http.post("/api/jobs/retry-all", json=body)
        assert answer.status_code == 200 and answer.json()["count"] == 1, answer.text
    assert (pgq_client.get_job(old).state, pgq_client.get_job(recent).state) == ("pending", "failed")
    with pytest.raises(BadArgument, match='argument "session_lifetime" needs a unit'):
        create_app(lambda: AsyncClient(roles["pgq_admin"]), session_lifetime="8")


def test_a_schema_without_the_functions_shows_no_button(pgq_client: Client, roles: dict[str, str]) -> None:
    """A database not migrated yet (pgq.retry_jobs and pgq.cancel_jobs came with migration 0018):
    the list works, without the buttons; a POST is answered 501, naming the function."""
    job_id = failed_job(pgq_client)
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgq.retry_jobs(text, text, text, timestamptz, integer, text[])")
        conn.execute("DROP FUNCTION pgq.cancel_jobs(text, text, text, timestamptz, integer, text[])")
    with dashboard(roles["pgq_admin"]) as http:
        assert bulk_button(http, "queue=mail&state=failed") is None
        assert "Read-only" not in http.get("/").text
        body = {"queue": "mail", "state": "failed", "max_jobs": 1}
        assert_error(http.post("/api/jobs/retry-all", json=body), 501, "42883", "pgq.retry_jobs", "pgq-thin migrate")
    assert pgq_client.get_job(job_id).state == "failed"


# "delete all shown" (issue 41): pgq.delete_jobs behind the same kind of button ------------------------


def test_delete_all_shown_is_offered_for_finished_and_queued_states_never_for_running(
        pgq_client: Client, roles: dict[str, str]) -> None:
    pending = pgq_client.enqueue_many("mail", "a", [{}] * 3)
    kept = pgq_client.enqueue("mail", "b", {})
    running = pgq_client.enqueue("busy", "a", {})
    [job] = pgq_client.claim("w", ["busy"])
    assert job.id == running
    done = pgq_client.enqueue("mail", "c", {})
    [job] = pgq_client.claim("w", ["mail"], kinds=["c"])
    assert job.id == done and pgq_client.complete(job.id, job.attempt)
    with dashboard(roles["pgq_admin"]) as http:
        assert list(bulk_buttons(http, "queue=busy&state=running")) == ["cancel"]
        assert list(bulk_buttons(http, "queue=mail&state=done")) == ["delete"]
        assert list(bulk_buttons(http, "queue=mail&state=pending")) == ["cancel", "delete"]
        of_kind = bulk_button(http, "queue=mail&state=pending&kind=a", "delete")
        assert of_kind is not None and of_kind["label"] == "delete all shown (3)"
        assert of_kind["confirm"].startswith("Delete all 3 pending jobs of queue mail of kind a?")
        answer = press(http, of_kind)
        assert answer.json() == {"ok": True, "count": 3, "detail": "deleted 3 pending job(s) of queue mail of kind a"}
        # A running job is never deleted: pgq refuses the state, naming it, and nothing changes.
        body = {"queue": "busy", "state": "running", "kind": None, "before": None, "max_jobs": 5}
        assert_error(http.post("/api/jobs/delete-all", json=body), 400, "22023", '"state"')
    for job_id in pending:
        with pytest.raises(JobNotFound):
            pgq_client.get_job(job_id)
    assert (pgq_client.get_job(kept).state, pgq_client.get_job(running).state) == ("pending", "running")
    assert pgq_client.get_job(done).state == "done"


def test_a_schema_without_delete_jobs_shows_the_other_buttons_only(pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgq.delete_jobs(text, text, text, timestamptz, integer, text[])")
    with dashboard(roles["pgq_admin"]) as http:
        assert list(bulk_buttons(http, "queue=mail&state=failed")) == ["retry"]
        body = {"queue": "mail", "state": "failed", "max_jobs": 1}
        assert_error(http.post("/api/jobs/delete-all", json=body), 501, "42883", "pgq.delete_jobs", "pgq-thin migrate")
    assert pgq_client.get_job(job_id).state == "failed"


def test_the_buttons_act_on_the_jobs_holding_the_lists_tags_only(pgq_client: Client, roles: dict[str, str]) -> None:
    """Issue 41: with the list's tags filter, the buttons count (through pgq.list_jobs: pgq.stats
    has no tags) and act on the jobs holding all of them, and say so."""
    tagged = [pgq_client.enqueue("mail", "send", {}, tags=["eu", "vip"]) for _ in range(2)]
    eu_only = pgq_client.enqueue("mail", "send", {}, tags=["eu"])
    untagged = pgq_client.enqueue("mail", "send", {})
    with dashboard(roles["pgq_admin"]) as http:
        cancel = bulk_button(http, "queue=mail&state=pending&tags=vip,eu")
        assert cancel is not None and cancel["label"] == "cancel all shown (2)"
        assert cancel["confirm"] == "Cancel all 2 pending jobs of queue mail tagged vip, eu?"
        assert cancel["body"]["tags"] == ["vip", "eu"] and cancel["body"]["max_jobs"] == 2
        answer = press(http, cancel)
        assert answer.json() == {"ok": True, "count": 2,
                                 "detail": "cancelled 2 pending job(s) of queue mail tagged vip, eu"}
        assert [pgq_client.get_job(i).state for i in (*tagged, eu_only, untagged)] == [
            "cancelled", "cancelled", "pending", "pending"]
        assert pgq_client.cancel(eu_only)
        delete = bulk_button(http, "queue=mail&state=cancelled&tags=vip", "delete")
        assert delete is not None and delete["label"] == "delete all shown (2)"
        assert press(http, delete).json()["count"] == 2
        assert bulk_button(http, "queue=mail&state=cancelled&tags=vip", "delete") is None
        assert bulk_button(http, "queue=mail&state=cancelled&tags=eu", "delete")["label"] == (  # type: ignore[index]
            "delete all shown (1)")
        bad = {"queue": "mail", "state": "cancelled", "tags": "eu", "max_jobs": 1}
        assert_error(http.post("/api/jobs/delete-all", json=bad), 400, None, '"tags"')
    for job_id in tagged:
        with pytest.raises(JobNotFound):
            pgq_client.get_job(job_id)
    assert (pgq_client.get_job(eu_only).state, pgq_client.get_job(untagged).state) == ("cancelled", "pending")
