"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against a real
``pgq-thin dashboard`` process on a throwaway database. It logs in with the token (taken from
$PGQ_DASHBOARD_TOKEN), reads the pages, sees a <script> in a payload and an error shown as text,
clicks retry on a failed job and sees it pending, watches the throughput chart move, logs out (and
finds the old session cookie refused), and as a pgq_monitor login finds the buttons disabled (and a
login made pgq_monitor after its page was shown sees the database's refusal when it clicks); follows
a job's links to its dependency, the dependency's batch and the batch's callback job (issue 26);
retries all the failed jobs a filtered list shows, after a confirmation stating the count (issue 27).
Screenshots go to the test's temporary directory (and, with $PGQ_DASHBOARD_SCREENSHOTS set, to that
directory too: docs/dashboard.png comes from there)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright
from psycopg.conninfo import conninfo_to_dict

from pgq_thin import Client

from dashboardkit import (
    SCRIPT,
    close_batch,
    enqueue_linked,
    failed_job,
    finish,
    logins,
    open_batch,
    running_dashboard,
    unknown_job,
)

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium (apt-get install chromium)")
    with sync_playwright() as playwright:
        # Chromium's sandbox refuses to run as root (CI runs the suite as root): --no-sandbox then. The
        # page is the dashboard under test on 127.0.0.1, not content from the internet.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    page = context.new_page()
    page.set_default_timeout(20_000)
    expect.set_options(timeout=20_000)  # a loaded CI machine: wait longer for a condition, never a fixed time
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        yield page
    finally:
        assert dialogs == [], f"a script ran: {dialogs}"
        context.close()


def screenshot(page: Page, directory: Path, name: str) -> Path:
    path = directory / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # an image of the page, not an empty one
    keep = os.environ.get("PGQ_DASHBOARD_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / name)
    return path


def test_an_admin_logs_in_reads_the_pages_and_retries_a_failed_job(
        pgq_client: Client, page: Page, tmp_path: Path) -> None:
    failed = failed_job(pgq_client, error=f"SMTP 550 {SCRIPT}")
    unknown_job(pgq_client, queue="billing")
    pgq_client.enqueue_many("mail", "send", [{"n": n} for n in range(12)])
    pgq_client.schedule("nightly-report", "reports", "build", cron="0 3 * * *")
    with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_admin"], TOKEN) as url:
        assert page.goto(f"{url}/").status == 401  # the token is required: the login form
        page.fill("input[name=token]", "not it")
        page.click("button:has-text('log in')")
        expect(page.locator("#login-error")).to_be_visible()
        page.fill("input[name=token]", TOKEN)
        page.click("button:has-text('log in')")
        expect(page).to_have_url(f"{url}/")

        mail = page.locator('tr[data-queue="mail"]')
        expect(mail.locator('td[data-col="pending"]')).to_have_text("12")
        expect(mail.locator('td[data-col="failed"]')).to_have_text("1")
        expect(mail.locator('td[data-col="oldest_ready_age"]')).not_to_have_text("-")
        expect(page.locator('tr[data-queue="billing"] td[data-col="outcome_unknown"]')).to_have_text("1")
        expect(page.locator("#read-only")).to_have_count(0)
        expect(page.locator("#rate")).not_to_have_text("…")  # the chart polled /api/queues
        # Jobs finish while the page is open (in two rounds): the chart's rate rises, the counts follow.
        for batch, done in ((3, "3"), (4, "7"), (5, "12")):
            for job in pgq_client.claim("test-worker", ["mail"], batch=batch):
                assert pgq_client.complete(job.id, job.attempt)
            expect(mail.locator('td[data-col="done"]')).to_have_text(done)
        expect(page.locator("#peak")).not_to_have_text("0.0")
        expect(mail.locator('td[data-col="oldest_ready_age"]')).to_have_text("-")  # nothing of mail is due now
        assert page.locator("#throughput polyline").get_attribute("points")
        screenshot(page, tmp_path, "dashboard.png")

        page.click("nav >> text=Jobs")
        page.select_option("select[name=state]", "failed")
        page.click("button:has-text('filter')")
        expect(page).to_have_url(f"{url}/jobs?queue=&state=failed&kind=&tags=")
        rows = page.locator("#jobs tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.locator("td.error")).to_contain_text("<script>window.__pwned")
        page.click(f"#jobs >> text={failed}")

        expect(page).to_have_url(f"{url}/jobs/{failed}")
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("#payload")).to_contain_text(f'"note": "{SCRIPT}"')
        expect(page.locator("#last-error")).to_have_text(f"SMTP 550 {SCRIPT}")
        assert page.evaluate("window.__pwned") is None  # shown as text, never run
        expect(page.locator("#history tbody tr")).to_have_count(2)  # claimed, failed
        screenshot(page, tmp_path, "job-failed.png")

        page.click("button:has-text('retry')")
        expect(page.locator("#job-state")).to_have_text("pending")
        assert pgq_client.get_job(failed).state == "pending"
        expect(page.locator("#history tbody tr").last).to_contain_text("retried")
        screenshot(page, tmp_path, "job-retried.png")

        page.click("nav >> text=Schedules")
        expect(page.locator("#schedules")).to_contain_text("nightly-report")
        expect(page.locator("#schedules")).to_contain_text("0 3 * * *")
        page.click("nav >> text=Health")
        expect(page.locator("#findings")).to_contain_text("expired_leases")
        screenshot(page, tmp_path, "health.png")

        # Pause from the overview; the button turns into resume.
        page.goto(f"{url}/")
        page.locator('tr[data-queue="mail"] button:has-text("pause")').click()
        expect(page.locator('tr[data-queue="mail"]')).to_contain_text("paused")
        assert [q.paused for q in pgq_client.stats() if q.queue == "mail"] == [True]
        page.locator('tr[data-queue="mail"] button:has-text("resume")').click()
        expect(page.locator('tr[data-queue="mail"]')).to_contain_text("active")

        # Log out: the session ends, and its cookie, put back into the browser, lets nobody in.
        session = [c for c in page.context.cookies() if c["name"] == "pgq_dashboard"]
        assert len(session) == 1 and TOKEN not in session[0]["value"]
        page.click("button:has-text('log out')")
        expect(page).to_have_url(f"{url}/login")
        page.context.add_cookies(session)  # type: ignore[arg-type]
        assert page.goto(f"{url}/").status == 401
        expect(page.locator("input[name=token]")).to_be_visible()


def test_a_monitor_login_sees_a_read_only_dashboard(pgq_client: Client, page: Page, tmp_path: Path) -> None:
    failed = failed_job(pgq_client)
    with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_monitor"]) as url:
        page.goto(f"{url}/")
        expect(page.locator("#read-only")).to_contain_text("pgq_monitor")
        expect(page.locator('tr[data-queue="mail"] button:has-text("pause")')).to_be_disabled()
        page.goto(f"{url}/jobs/{failed}")
        retry = page.locator("button:has-text('retry')")
        expect(retry).to_be_disabled()
        role = conninfo_to_dict(dsns["pgq_monitor"])["user"]
        expect(retry).to_have_attribute("title", f"read-only: role {role} may not call pgq.retry")
        # A direct POST from the page (same origin) is refused by the database, with a hint.
        answer = page.evaluate("""async (id) => {
            const r = await fetch('/api/jobs/' + id + '/retry', {method: 'POST'});
            const body = await r.json();
            return [r.status, body.error, body.hint];
        }""", failed)
        assert answer[0] == 403 and answer[1] == "permission denied for function retry" and "read-only" in answer[2]
        screenshot(page, tmp_path, "read-only.png")
    assert pgq_client.get_job(failed).state == "failed"


def test_a_login_made_pgq_monitor_after_the_page_was_shown_presses_retry_and_sees_the_databases_refusal(
        pgq_client: Client, page: Page, tmp_path: Path) -> None:
    """The page asked once what the login may do (retry: yes); the login then becomes a pgq_monitor
    login. Its click is the call, and the database refuses it: the page says so, in its words."""
    failed = failed_job(pgq_client)
    with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_admin"]) as url:
        page.goto(f"{url}/jobs/{failed}")
        retry = page.locator("button:has-text('retry')")
        expect(retry).to_be_enabled()
        role = conninfo_to_dict(dsns["pgq_admin"])["user"]
        with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
            conn.execute(f"GRANT pgq_monitor TO {role}")
            conn.execute(f"REVOKE pgq_admin FROM {role}")
        retry.click()
        flash = page.locator("#flash")
        expect(flash).to_be_visible()
        expect(flash).to_have_class(re.compile(r"\bbad\b"))
        expect(flash).to_contain_text("permission denied for function retry [SQLSTATE 42501]")
        expect(flash).to_contain_text("hint: read-only: the dashboard's database login may not call pgq.retry")
        expect(retry).to_be_enabled()  # nothing happened: it can be pressed again
        expect(page.locator("#job-state")).to_have_text("failed")
        screenshot(page, tmp_path, "refused.png")
    assert pgq_client.get_job(failed).state == "failed"


def test_a_job_links_to_its_dependencies_its_batch_and_the_batchs_callback(
        pgq_client: Client, page: Page, tmp_path: Path) -> None:
    dsn = pgq_client.dsn
    batch = open_batch(dsn, "after", "report", "all_ended")
    members = enqueue_linked(dsn, "work", "member", batch=batch, count=3)
    [merge] = enqueue_linked(dsn, "flow", "merge", depends_on=members[:2], dependency_mode="all_ended")
    finish(pgq_client, "work", ["done", "failed"])
    close_batch(dsn, batch)
    with logins(dsn) as dsns, running_dashboard(dsns["pgq_monitor"], TOKEN) as url:
        assert page.goto(f"{url}/jobs/{merge}").status == 401  # the login form, back to the job once in
        page.fill("input[name=token]", TOKEN)
        page.click("button:has-text('log in')")
        expect(page).to_have_url(f"{url}/jobs/{merge}")
        expect(page.locator("#dependency-mode")).to_have_text("all_ended")
        expect(page.locator("#dependencies tbody tr")).to_have_count(2)
        expect(page.locator(f'#dependencies tr[data-job="{members[1]}"]')).to_contain_text("failed")
        expect(page.locator("#dependants")).to_have_text("None.")
        screenshot(page, tmp_path, "job-dependencies.png")

        page.click(f"#dependencies >> text={members[0]}")
        expect(page).to_have_url(f"{url}/jobs/{members[0]}")
        expect(page.locator(f'#dependants tr[data-job="{merge}"]')).to_contain_text("pending")
        page.click("#batch a")

        expect(page).to_have_url(f"{url}/batches/{batch}")
        expect(page.locator("#batch-state")).to_have_text("sealed")
        counts = page.locator("#counts")
        for col, value in (("members", "3"), ("unfinished", "1"), ("done", "1"), ("failed", "1"), ("cancelled", "0")):
            expect(counts.locator(f'td[data-col="{col}"]')).to_have_text(value)
        expect(page.locator("#run-when")).to_contain_text("all_ended")
        expect(page.locator("#callback-job")).to_have_text("not enqueued yet")
        screenshot(page, tmp_path, "batch-sealed.png")

        page.evaluate("window.__not_reloaded = true")
        finish(pgq_client, "work", ["done"])  # the last member (merge, released, waits in flow): the callback
        expect(page.locator("#batch-state")).to_have_text("finished")  # the page follows, no reload
        expect(page.locator("[data-live]")).to_have_count(0)  # finished: nothing refreshes any more
        assert page.evaluate("window.__not_reloaded") is True
        expect(counts.locator('td[data-col="unfinished"]')).to_have_text("0")
        expect(counts.locator('td[data-col="done"]')).to_have_text("2")
        page.click("#callback-job a")
        expect(page.locator("#job-state")).to_have_text("pending")
        expect(page.locator("#meta")).to_contain_text(f'"id": {batch}')
        [callback] = [j.id for j in pgq_client.list_jobs(queue="after")]
        expect(page).to_have_url(f"{url}/jobs/{callback}")


def test_retry_all_shown_asks_with_the_count_and_retries_them(
        pgq_client: Client, browser: Browser, tmp_path: Path) -> None:
    """Issue 27: the job list filtered to one queue's failed jobs; "retry all shown" asks for a
    confirmation that states the count (dismissed: nothing changes; accepted: they are retried)."""
    failed = [failed_job(pgq_client) for _ in range(3)]
    other = failed_job(pgq_client, queue="billing")
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    page = context.new_page()
    page.set_default_timeout(20_000)
    expect.set_options(timeout=20_000)
    asked: list[str] = []
    answers = iter([False, True])  # dismissed first, then accepted

    def confirm(dialog: Dialog) -> None:
        asked.append(f"{dialog.type}: {dialog.message}")
        dialog.accept() if next(answers) else dialog.dismiss()

    page.on("dialog", confirm)
    try:
        with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_admin"]) as url:
            page.goto(f"{url}/jobs?queue=mail&state=failed")
            expect(page.locator("#jobs tbody tr")).to_have_count(3)
            button = page.locator("#bulk button", has_text="retry all shown")
            expect(button).to_have_text("retry all shown (3)")
            expect(page.locator("#bulk button", has_text="delete all shown")).to_have_text("delete all shown (3)")
            screenshot(page, tmp_path, "retry-all-shown.png")
            button.click()
            expect(button).to_be_enabled()  # dismissed: the button is back, nothing sent
            assert asked == ["confirm: Retry all 3 failed jobs of queue mail?"]
            assert [pgq_client.get_job(i).state for i in failed] == ["failed"] * 3
            button.click()
            expect(page.locator("#flash")).to_have_text("retried 3 failed job(s) of queue mail")
            expect(page.locator(".empty")).to_have_text("No jobs match.")  # the page, reloaded
            expect(page.locator("#bulk")).to_have_count(0)
            assert len(asked) == 2
            screenshot(page, tmp_path, "retried-all.png")
        assert [pgq_client.get_job(i).state for i in failed] == ["pending"] * 3
        assert pgq_client.get_job(other).state == "failed"
    finally:
        context.close()


def test_beyond_loopback_without_a_token_it_warns(pgq_dsn: str) -> None:
    printed: list[str] = []
    with running_dashboard(pgq_dsn, None, "--host", "0.0.0.0", output=printed):
        pass
    assert "warning: listening on 0.0.0.0 without a token" in printed[0]
    printed.clear()
    with running_dashboard(pgq_dsn, None, output=printed):  # loopback: no warning
        pass
    assert "pgq dashboard on http://127.0.0.1:" in printed[0] and "warning" not in printed[0]


def test_the_lists_and_a_live_jobs_page_refresh_by_themselves(pgq_client: Client, page: Page) -> None:
    """Issue 42: the jobs list, the queues overview, the workers page and a job's page follow the
    database without a reload (a marker set in the page survives: it was never reloaded); what the
    user typed in the filter stays; a finished job's page stops refreshing."""
    first = pgq_client.enqueue("mail", "send", {"n": 1})
    with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_admin"]) as url:
        page.goto(f"{url}/jobs")
        expect(page.locator(f'#jobs tr[data-job="{first}"]')).to_have_count(1)
        page.evaluate("window.__not_reloaded = true")
        page.fill("input[name=kind]", "typed, not sent")  # the cursor stays in the field
        later = pgq_client.enqueue("mail", "send", {"n": 2})
        expect(page.locator(f'#jobs tr[data-job="{later}"]')).to_have_count(1)
        expect(page.locator("input[name=kind]")).to_have_value("typed, not sent")
        expect(page.locator("input[name=kind]")).to_be_focused()
        assert page.evaluate("window.__not_reloaded") is True

        page.goto(f"{url}/")
        page.evaluate("window.__not_reloaded = true")
        expect(page.locator('tr[data-queue="billing"]')).to_have_count(0)
        pgq_client.enqueue("billing", "charge", {})
        pgq_client.pause("mail")
        expect(page.locator('tr[data-queue="billing"]')).to_have_count(1)  # a new queue's row
        expect(page.locator('tr[data-queue="mail"]')).to_contain_text("paused")
        assert page.evaluate("window.__not_reloaded") is True
        pgq_client.resume("mail")

        page.goto(f"{url}/workers")
        page.evaluate("window.__not_reloaded = true")
        with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
            conn.execute("SELECT pgq.worker_heartbeat('live-worker-1', queues => ARRAY['mail'], running => 2)")
        expect(page.locator("#workers")).to_contain_text("live-worker-1")
        assert page.evaluate("window.__not_reloaded") is True

        page.goto(f"{url}/jobs/{first}")
        page.evaluate("window.__not_reloaded = true")
        expect(page.locator("#job-state")).to_have_text("pending")
        [job] = pgq_client.claim("test-worker", ["mail"])
        assert job.id == first
        expect(page.locator("#job-state")).to_have_text("running")
        expect(page.locator("#history tbody tr")).to_have_count(1)  # claimed
        assert pgq_client.complete(job.id, job.attempt)
        expect(page.locator("#job-state")).to_have_text("done")
        expect(page.locator("[data-live]")).to_have_count(0)  # finished: nothing refreshes any more
        assert page.evaluate("window.__not_reloaded") is True


def test_the_throughput_chart_starts_from_the_databases_counters(pgq_client: Client, page: Page) -> None:
    """Issue 42: the chart's first point is the database's finished counters (on the page as it is
    served), and a reload keeps the tab's samples: it does not start from nothing again."""
    failed_job(pgq_client)
    failed_job(pgq_client, queue="billing")
    points = page.locator("#throughput polyline")
    with logins(pgq_client.dsn) as dsns, running_dashboard(dsns["pgq_monitor"]) as url:
        page.goto(f"{url}/")
        expect(page.locator("#finished")).to_have_text("2")
        assert page.locator("#throughput").get_attribute("data-finished") == "2"
        expect(points).to_have_attribute("points", re.compile(r"^\S+( \S+){2,}$"))  # the seed, then the polls'
        stored = page.evaluate("JSON.parse(sessionStorage.getItem('pgq-throughput'))")
        assert [s[1] for s in stored] == [2] * len(stored)
        pgq_client.enqueue("mail", "send", {})
        [job] = pgq_client.claim("test-worker", ["mail"])
        assert pgq_client.complete(job.id, job.attempt)
        page.reload()
        expect(page.locator("#finished")).to_have_text("3")
        # At once (before its first poll, 2 s on): the samples of before the reload, and the new seed.
        seeded = page.evaluate("JSON.parse(sessionStorage.getItem('pgq-throughput'))")
        assert len(seeded) >= len(stored) + 1 and seeded[-1][1] >= 3 and seeded[0][1] == 2
        expect(page.locator("#peak")).not_to_have_text("0.0")  # the finished job, as a rate
