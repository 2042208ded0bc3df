"""The dashboard's JSON API and pages over Starlette's TestClient, on a real database with real
logins: a pgq_monitor login is read-only (the database's 403, nothing changes), a pgq_admin login
acts; the token (401 without it, Bearer, the login form's cookie); the Origin check (403); bad
input gets 400/404/409 with pgq's message and SQLSTATE, never a traceback; output is escaped."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.cli import build_parser
from pgq_thin.dashboard.app import COOKIE, create_app

from dashboardkit import SCRIPT, dashboard, failed_job, logins, unknown_job

OWN = "http://testserver"  # the TestClient's origin


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


def assert_error(response: Any, status: int, sqlstate: str | None, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["sqlstate"] == sqlstate, body
    for word in words:
        assert word in body["error"], body
    assert "Traceback" not in response.text


def test_monitor_login_reads_everything_and_may_act_on_nothing(pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    unknown = unknown_job(pgq_client)
    with dashboard(roles["pgq_monitor"]) as http:
        [mail] = http.get("/api/queues").json()["queues"]
        assert (mail["queue"], mail["failed"], mail["outcome_unknown"]) == ("mail", 1, 1)
        assert http.get(f"/api/jobs/{job_id}").json()["job"]["state"] == "failed"
        assert http.get("/api/health").json()["status"] in ("ok", "warning", "critical")

        page = http.get("/").text
        assert "Read-only" in page and "dash_monitor_" in page
        assert 'disabled title="read-only' in page  # the pause button
        job_page = http.get(f"/jobs/{job_id}").text
        assert 'disabled title="read-only: role dash_monitor_' in job_page  # the retry button

        for url, body in [(f"/api/jobs/{job_id}/retry", None), (f"/api/jobs/{job_id}/cancel", None),
                          (f"/api/jobs/{unknown}/resolve", {"state": "done"}),
                          ("/api/queues/mail/pause", None), ("/api/queues/mail/resume", None)]:
            refused = http.post(url, json=body)  # the database's own refusal, and what to do about it
            assert_error(refused, 403, "42501", "permission denied for function")
            assert "read-only" in refused.json()["hint"] and "pgq_admin" in refused.json()["hint"]
    assert pgq_client.get_job(job_id).state == "failed"
    assert pgq_client.get_job(unknown).state == "outcome_unknown"
    assert not pgq_client.stats()[0].paused


def test_the_overview_shows_each_queues_settings_to_a_monitor(pgq_client: Client, roles: dict[str, str]) -> None:
    """Paused kinds, fair mode, the max_running cap, lease, max_run_time, archive and per-queue grants, read through
    pgq.queue_settings (a pgq_monitor function), on the overview and in /api/queues."""
    failed_job(pgq_client, queue="mail")
    failed_job(pgq_client, queue="batch")
    pgq_client.configure_queue("mail", max_wait="5m")
    pgq_client.configure_queue("seq", key_sequence="halt")
    pgq_client.configure_queue("kept", archive=True)
    pgq_client.configure_queue("batch", fair=True, max_running=3, lease=45, max_run_time=600)
    pgq_client.grant_queue("batch", "pgq_admin", "claim")
    pgq_client.pause("batch", kind="resize")
    pgq_client.pause("batch", kind="crop")
    with dashboard(roles["pgq_monitor"]) as http:
        page = http.get("/").text
        settings = http.get("/api/queues").json()["settings"]
    assert "kinds paused: crop, resize · fair · max 3 running · lease 45s · max run 10m · 25 attempts · grants: claim" \
        in page
    assert "fifo · lease 30s · aging after 5m · 25 attempts" in page
    assert "fifo · lease 30s · sequence: halt · 25 attempts" in page
    assert "fifo · lease 30s · archive · 25 attempts" in page  # finished jobs moved to pgq.archive
    assert page.count(" archive ") == 1
    by_name = {q["name"]: q for q in settings}
    assert (by_name["batch"]["fair"], by_name["batch"]["max_running"], by_name["batch"]["restricted"],
            by_name["batch"]["paused_kinds"]) == (True, 3, ["claim"], ["crop", "resize"])
    assert (by_name["mail"]["fair"], by_name["mail"]["restricted"], by_name["mail"]["max_wait"]) == (False, None, 300)
    assert (by_name["seq"]["key_sequence"], by_name["mail"]["key_sequence"]) == ("halt", None)
    assert (by_name["kept"]["archive"], by_name["mail"]["archive"]) == (True, False)


def test_admin_login_acts_through_the_pgq_functions(pgq_client: Client, roles: dict[str, str]) -> None:
    failed = failed_job(pgq_client)
    unknown = unknown_job(pgq_client)
    pending = pgq_client.enqueue("mail", "send", {})
    with dashboard(roles["pgq_admin"]) as http:
        assert "Read-only" not in http.get("/").text
        answer = http.post(f"/api/jobs/{failed}/retry").json()
        assert answer["ok"] is True and answer["job"]["state"] == "pending"
        answer = http.post(f"/api/jobs/{unknown}/resolve", json={"state": "done"}).json()
        assert answer["ok"] is True and answer["job"]["state"] == "done"
        assert http.post(f"/api/jobs/{pending}/cancel").json()["job"]["state"] == "cancelled"
        again = http.post(f"/api/jobs/{pending}/cancel").json()  # pgq.cancel answers false: already finished
        assert again["ok"] is False and "already finished" in again["detail"]

        assert http.post("/api/queues/mail/pause").json()["queue"]["paused"] is True
        assert http.get("/api/queues").json()["queues"][0]["paused"] is True
        assert "resume</button>" in http.get("/").text
        assert http.post("/api/queues/mail/resume").json()["queue"]["paused"] is False
    assert [e.event for e in pgq_client.job_history(failed)][-1] == "retried"
    assert pgq_client.get_job(unknown).state == "done"
    assert not pgq_client.stats()[0].paused


def test_bad_input_gets_pgqs_message_and_sqlstate(pgq_client: Client, roles: dict[str, str]) -> None:
    done = pgq_client.enqueue("mail", "send", {})
    [job] = pgq_client.claim("w", ["mail"])
    assert pgq_client.complete(job.id, job.attempt)
    unknown = unknown_job(pgq_client)
    with dashboard(roles["pgq_admin"]) as http:
        assert_error(http.get("/api/jobs/987654"), 404, "P0002", "987654")
        assert_error(http.post("/api/jobs/987654/retry"), 404, "P0002", "987654")
        assert_error(http.get("/api/jobs/abc"), 400, None, "job id", "'abc'")
        assert_error(http.get("/api/jobs/99999999999999999999"), 400, None, "job id")
        assert_error(http.post(f"/api/jobs/{done}/retry"), 409, "55000", "only failed or cancelled")
        assert_error(http.post(f"/api/jobs/{done}/resolve", json={"state": "done"}), 409, "55000", "outcome_unknown")
        assert_error(http.post(f"/api/jobs/{unknown}/resolve", json={"state": "maybe"}), 400, "22023", "state")
        assert_error(http.post(f"/api/jobs/{unknown}/resolve", content=b"{not json"), 400, None, "JSON")
        assert_error(http.post(f"/api/jobs/{unknown}/resolve", json={"status": "done"}), 400, None, "state")
        assert_error(http.get("/api/jobs?state=bogus"), 400, "22023", "state", "bogus")
        assert_error(http.get("/api/jobs?limit=5000"), 400, "22023", "limit_rows")
        assert_error(http.get("/api/jobs?limit=ten"), 400, None, "limit", "'ten'")
        assert_error(http.get("/api/jobs?before_id=x"), 400, None, "before_id")
        assert_error(http.post("/api/queues/nosuch/pause"), 400, "22023", "nosuch")
        # A request string is a bound parameter, never SQL.
        injected = "mail'; DROP TABLE pgq.jobs; --"
        assert_error(http.get("/api/jobs", params={"queue": injected}), 400, "22023", "queue")
        assert_error(http.get("/api/nothing-here"), 404, None, "no such page")

        page = http.get("/jobs/987654")
        assert page.status_code == 404 and "SQLSTATE P0002" in page.text and "Traceback" not in page.text
        assert http.get("/jobs?state=<b>bogus</b>").status_code == 400
        assert "&lt;b&gt;bogus" in http.get("/jobs?state=<b>bogus</b>").text
    assert pgq_client.get_job(unknown).state == "outcome_unknown"
    assert len(pgq_client.list_jobs()) == 2  # the table is there, the jobs too


def test_a_script_in_a_payload_or_error_is_text(pgq_client: Client) -> None:
    job_id = failed_job(pgq_client, error=f"boom {SCRIPT}")
    with dashboard(pgq_client.dsn) as http:
        for page in (http.get(f"/jobs/{job_id}"), http.get("/jobs"), http.get("/jobs?state=failed")):
            assert page.status_code == 200
            assert SCRIPT not in page.text and "<script>window" not in page.text
        job_page = http.get(f"/jobs/{job_id}")
        assert "&lt;script&gt;window.__pwned = 1; alert(&#39;pwned&#39;)&lt;/script&gt;" in job_page.text
        assert "script-src 'self'" in job_page.headers["content-security-policy"]
        assert http.get(f"/api/jobs/{job_id}").json()["job"]["last_error"] == f"boom {SCRIPT}"


def test_an_encrypted_payload_and_result_show_as_encrypted_and_never_a_key(pgq_client: Client) -> None:
    key = bytes(range(32))
    with Client(pgq_client.dsn, keys={"k2": key}, encrypt_with="k2") as sealed:
        job_id = sealed.enqueue("sealed", "send", {"card": "4111 1111"})
        [claimed] = sealed.claim("w", ["sealed"])
        assert sealed.complete(job_id, claimed.attempt, result={"receipt": "r-1"}) is True
    with dashboard(pgq_client.dsn) as http:
        page = http.get(f"/jobs/{job_id}").text
        assert re.search(r'<pre id="payload">\[encrypted, key k2\]</pre>', page), page
        assert re.search(r'<pre id="result">\[encrypted, key k2\]</pre>', page), page
        assert "4111" not in page and "r-1" not in page and key.hex() not in page
        stored = http.get(f"/api/jobs/{job_id}").json()["job"]["payload"]
        assert stored["pgq_enc"] == 1 and stored["kid"] == "k2"  # the API gives the envelope as stored


def test_jobs_page_by_page(pgq_client: Client) -> None:
    ids = pgq_client.enqueue_many("mail", "send", [{"n": n} for n in range(5)])
    pgq_client.enqueue("other", "send", {})
    with dashboard(pgq_client.dsn) as http:
        seen: list[int] = []
        url: str | None = "/api/jobs?queue=mail&limit=2"
        while url:
            page = http.get(url).json()
            seen += [j["id"] for j in page["jobs"]]
            before = page["next_before_id"]
            url = f"/api/jobs?queue=mail&limit=2&before_id={before}" if before else None
        assert seen == sorted(ids, reverse=True)
        html = http.get("/jobs?queue=mail&limit=2").text
        assert f'href="/jobs?queue=mail&amp;limit=2&amp;before_id={ids[3]}"' in html
        assert http.get("/api/jobs?kind=send&state=pending").json()["next_before_id"] is None
        assert len(http.get("/api/jobs?kind=send&state=pending").json()["jobs"]) == 6


def test_the_token_guards_every_request(pgq_client: Client) -> None:
    job_id = failed_job(pgq_client)
    with dashboard(pgq_client.dsn, token="s3cret") as http:
        for url in ("/api/queues", f"/api/jobs/{job_id}", "/api/health", "/healthz"):
            response = http.get(url)
            assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
            assert http.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert http.post(f"/api/jobs/{job_id}/retry").status_code == 401
        assert pgq_client.get_job(job_id).state == "failed"
        # A page answers 401 with the login form, which sets the cookie and goes back to the page.
        first = http.get("/jobs?state=failed")
        assert first.status_code == 401 and 'name="token"' in first.text
        assert '<input type="hidden" name="next" value="/jobs?state=failed">' in first.text
        form = http.get("/login?next=/jobs")
        assert form.status_code == 200 and 'name="token"' in form.text
        wrong = http.post("/login", data={"token": "guess", "next": "/jobs"}, follow_redirects=False)
        assert wrong.status_code == 401 and COOKIE not in wrong.cookies
        right = http.post("/login", data={"token": "s3cret", "next": "/jobs"}, follow_redirects=False)
        assert right.status_code == 303 and right.headers["location"] == "/jobs"
        cookie = right.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "s3cret" not in cookie
        assert http.get("/jobs").status_code == 200  # the client kept the cookie
        assert http.post(f"/api/jobs/{job_id}/retry").json()["job"]["state"] == "pending"
        # The login form only sends the browser to this site's pages.
        away = http.post("/login", data={"token": "s3cret", "next": "//evil.example/"}, follow_redirects=False)
        assert away.headers["location"] == "/"
        http.cookies.clear()
        assert http.get("/api/queues").status_code == 401
        assert http.get("/static/dashboard.css").status_code == 200  # the login form's own style


def test_a_post_from_another_origin_is_refused(pgq_client: Client) -> None:
    job_id = failed_job(pgq_client)
    with dashboard(pgq_client.dsn) as http:
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "https://testserver"},
                        {"Sec-Fetch-Site": "cross-site"}):
            assert_error(http.post(f"/api/jobs/{job_id}/retry", headers=headers), 403, None, "refused")
            assert_error(http.post("/api/queues/mail/pause", headers=headers), 403, None, "refused")
        assert pgq_client.get_job(job_id).state == "failed" and not pgq_client.stats()[0].paused
        ok = http.post(f"/api/jobs/{job_id}/retry", headers={"Origin": OWN, "Sec-Fetch-Site": "same-origin"})
        assert ok.status_code == 200 and ok.json()["job"]["state"] == "pending"
    with dashboard(pgq_client.dsn, token="s3cret") as http:  # the token does not let another origin in
        response = http.post("/login", data={"token": "s3cret"}, headers={"Origin": "http://evil.example"})
        assert response.status_code == 403


def test_only_the_loopback_host_names_when_bound_to_loopback(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn, allowed_hosts=["127.0.0.1", "localhost"]) as http:
        assert http.get("http://127.0.0.1/healthz").status_code == 200
        assert http.get("http://rebound.example/api/queues").status_code == 400  # DNS rebinding


def test_healthz_and_health(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn) as http:
        live = http.get("/healthz").json()
        assert live == {"status": "ok", "pgq_version": pgq_client.version()}
        findings = http.get("/api/health").json()["findings"]
        assert {f["check"] for f in findings} == {f.check for f in pgq_client.health()}
        assert "expired_leases" in http.get("/health").text


def test_healthz_is_503_when_the_database_does_not_answer(pgq_dsn: str) -> None:
    def unreachable() -> AsyncClient:
        client = AsyncClient(make_conninfo(pgq_dsn, dbname="pgq_no_such_database"), min_size=0, max_size=1)
        client.pool.timeout = 2  # how long a request waits for a connection (30 s by default)
        return client

    with TestClient(create_app(unreachable)) as http:
        response = http.get("/healthz")
        assert response.status_code == 503, response.text
        assert response.json()["status"] == "unavailable" and "Traceback" not in response.text
        assert_error(http.get("/api/queues"), 503, None)


def test_metrics_are_the_queue_metrics_in_the_prometheus_format(pgq_client: Client, roles: dict[str, str]) -> None:
    failed_job(pgq_client)
    pgq_client.enqueue_many("mail", "send", [{}, {}])
    with dashboard(roles["pgq_monitor"], token="s3cret") as http:
        assert http.get("/metrics").status_code == 401
        response = http.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(response.text) for s in family.samples}
    [mail] = pgq_client.stats()
    for state in ("pending", "scheduled", "running", "outcome_unknown"):
        assert samples[("pgq_jobs", (("queue", "mail"), ("state", state)))] == getattr(mail, state)
    assert samples[("pgq_jobs_finished_total", (("queue", "mail"), ("state", "failed")))] == 1
    assert samples[("pgq_expired_leases", (("queue", "mail"),))] == 0


def test_the_command_binds_loopback_by_default() -> None:
    args = build_parser().parse_args(["dashboard"])
    assert (args.host, args.port, args.token) == ("127.0.0.1", 8080, None)


def test_without_the_extra_the_command_says_what_to_install() -> None:
    hide = "import sys; sys.modules['uvicorn'] = None; from pgq_thin.cli import main; sys.exit(main(['dashboard']))"
    run = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "pgq-thin: the dashboard needs the dashboard extra (missing: uvicorn): pip install 'pgq-thin[dashboard]'"]


def test_the_job_page_and_api_show_the_producers_meta_escaped(pgq_client: Client) -> None:
    job_id = pgq_client.enqueue("mail", "send", meta={"source": SCRIPT})
    with dashboard(pgq_client.dsn) as http:
        assert http.get(f"/api/jobs/{job_id}").json()["job"]["meta"] == {"source": SCRIPT}
        page = http.get(f"/jobs/{job_id}").text
        assert '<pre id="meta">' in page and SCRIPT not in page and "&lt;script&gt;window" in page


def test_the_workers_page_and_api_list_the_live_workers_escaped(pgq_client: Client, roles: dict[str, str]) -> None:
    pgq_client.worker_heartbeat("w-1", ["mail"], ["send"], running=2, host=SCRIPT, pid=42)
    with dashboard(roles["pgq_monitor"]) as http:
        [entry] = http.get("/api/workers").json()["workers"]
        assert (entry["worker"], entry["queues"], entry["kinds"], entry["running"], entry["host"]) == (
            "w-1", ["mail"], ["send"], 2, SCRIPT)
        page = http.get("/workers").text
        assert "<td>w-1</td>" in page and "<td>send</td>" in page and SCRIPT not in page
        assert "&lt;script&gt;" in page
        pgq_client.worker_heartbeat("w-1", stopping=True)
        assert "No live worker in the registry" in http.get("/workers").text


def test_the_job_page_reads_right_for_a_job_that_failed_then_succeeded(pgq_client: Client) -> None:
    # Issue 42, the history items: a done job shows an earlier attempt's error as such, not in red
    # as its last error; a traceback repeated by the next attempt is shown once; empty Progress and
    # Meta boxes are left out; the worker's own check of a cancel is not shown as a rejected write.
    traceback = 'Traceback (most recent call last):\n  File "app.py", line 3, in send\nOSError: SMTP down'
    job_id = pgq_client.enqueue("mail", "send", {"to": "ada@example.com"}, max_attempts=3)
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        for _ in range(2):
            [job] = pgq_client.claim("test-worker", ["mail"])
            assert pgq_client.fail(job.id, job.attempt, traceback) == "pending"
            conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))
        [job] = pgq_client.claim("test-worker", ["mail"])
        assert pgq_client.complete(job.id, job.attempt)
        cancelled = pgq_client.enqueue("mail", "send", {})
        [running] = pgq_client.claim("test-worker", ["mail"])
        assert pgq_client.cancel(cancelled) and pgq_client.renew(running.id, running.attempt) is None
    with dashboard(pgq_client.dsn) as http:
        page = http.get(f"/jobs/{job_id}").text
        assert "An earlier attempt's error" in page and '<pre id="last-error" class="earlier">' in page
        assert 'class="error">Traceback' not in page.split("<h2>History")[0]
        history = page.split("<h2>History")[1]
        assert history.count("OSError: SMTP down") == 1 and "the same traceback as attempt 1" in history
        assert '<pre id="progress">' not in page and '<pre id="meta">' not in page
        other = http.get(f"/jobs/{cancelled}").text.split("<h2>History")[1]
        assert "cancel noticed" in other and "rejected" not in other


def test_the_throughput_chart_is_seeded_from_the_databases_finished_counters(pgq_client: Client) -> None:
    """Issue 42: the overview carries the finished counters (pgq.stats' done + failed + cancelled,
    all queues) as the chart's first point, so a rate shows from the first poll on; a prune does not
    lower them (they are counters, not the rows stored)."""
    failed_job(pgq_client)
    pgq_client.enqueue_many("mail", "send", [{"n": n} for n in range(3)])
    for job in pgq_client.claim("test-worker", ["mail"], batch=2):
        assert pgq_client.complete(job.id, job.attempt)
    cancelled = pgq_client.enqueue("billing", "charge", {})
    assert pgq_client.cancel(cancelled)
    assert pgq_client.prune(older_than=0) == 4
    with dashboard(pgq_client.dsn) as http:
        page = http.get("/").text
    assert '<div id="throughput" class="chart" data-finished="4">' in page
    assert '<span id="finished">4</span> finished' in page


def test_the_job_list_filters_by_tags(pgq_client: Client) -> None:
    """Issue 41: the list's tags filter (comma-separated; the jobs holding all of them), through
    pgq.list_jobs' tags, on the page (its form keeps it, its paging links carry it) and in /api/jobs;
    a bad tag is pgq's 22023 naming "tags"."""
    both = pgq_client.enqueue("mail", "send", {}, tags=["vip", "eu"])
    eu = pgq_client.enqueue("mail", "send", {}, tags=["eu"])
    untagged = pgq_client.enqueue("mail", "send", {})

    def rows(text: str) -> list[int]:
        return [int(i) for i in re.findall(r'<tr data-job="(\d+)">', text)]

    with dashboard(pgq_client.dsn) as http:
        assert rows(http.get("/jobs").text) == [untagged, eu, both]
        assert rows(http.get("/jobs?tags=eu").text) == [eu, both]
        page = http.get("/jobs?queue=mail&tags=+vip+,eu,").text
        assert rows(page) == [both]
        assert '<input name="tags" value="vip, eu"' in page
        assert '<td class="tags">eu, vip</td>' in page
        first = http.get("/jobs?tags=eu&limit=1").text
        assert rows(first) == [eu]
        older = re.search(r'<a href="([^"]+)" id="older">', first)
        assert older is not None and "tags=eu" in older.group(1)
        assert rows(http.get(html.unescape(older.group(1))).text) == [both]
        assert [j["id"] for j in http.get("/api/jobs?tags=eu,vip").json()["jobs"]] == [both]
        assert '<dd id="tags">eu, vip</dd>' in http.get(f"/jobs/{both}").text
        assert_error(http.get(f"/api/jobs?tags={'x' * 65}"), 400, "22023", "tags")
        bad = http.get(f"/jobs?tags={'x' * 65}")
        assert bad.status_code == 400 and "tags" in bad.text and "Traceback" not in bad.text


def test_an_archived_jobs_page_shows_it_its_history_and_its_archived_dependency(
        pgq_client: Client, roles: dict[str, str]) -> None:
    """Issue 40: a job the sweep moved into pgq.archive reads as it did in pgq.jobs: its page and
    /api/jobs/{id} show the job, its history, its dependency (archived too) with queue, kind and
    state, not as pruned, and its steps as none recorded."""
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        for queue in ("mail", "post"):  # the sweep's order: mail's job first, its link goes with it
            pgq_client.configure_queue(queue, archive=True, audit=True)
        dependency = pgq_client.enqueue("post", "print")
        [job] = pgq_client.claim("test-worker", ["post"])
        assert pgq_client.complete(job.id, job.attempt)
        job_id = pgq_client.enqueue("mail", "send", depends_on=[dependency])
        [job] = pgq_client.claim("test-worker", ["mail"])
        assert pgq_client.complete(job.id, job.attempt, {"sent": True})
        conn.execute("UPDATE pgq.jobs SET finished_at = finished_at - interval '2 minutes'")
        conn.execute("SELECT pgq.sweep()")
        assert conn.execute("SELECT count(*) FROM pgq.archive WHERE id IN (%s, %s)",
                            (job_id, dependency)).fetchone() == (2,)
    with dashboard(roles["pgq_monitor"]) as http:
        body = http.get(f"/api/jobs/{job_id}").json()
        assert (body["job"]["state"], body["job"]["result"]) == ("done", {"sent": True})
        assert [e["event"] for e in body["history"]][-1] == "completed"
        assert body["links"]["dependencies"] == [{"job_id": dependency, "queue": "post", "kind": "print",
                                                  "state": "done"}]
        assert body["steps"] == {"rows": [], "more": False}
        response = http.get(f"/jobs/{job_id}")
        assert response.status_code == 200
        page = response.text
        assert f'<tr data-job="{dependency}">' in page and "pruned" not in page
        assert '<p class="empty" id="steps">None recorded.</p>' in page
        assert "<h2>History" in page and "completed" in page.split("<h2>History")[1]
