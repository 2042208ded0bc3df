"""pgq_thin.contrib.django (docs/django.md) in a real Django project (tests/djangokit.py: the admin,
auth, sessions and pgq's app) against the test's PostgreSQL: enqueue on Django's own connection
commits and rolls back with the caller's rows; manage.py's pgq_migrate installs pgq, pgq_worker
runs a job to done (a process of its own, with a settings module), the inspection commands print;
the admin's pages of jobs and queues render, also for a pgq_monitor login, and refuse to add,
change or delete."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import djangokit
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_thin import BadArgument, Client, WaitTimeout

from loginkit import WATCH, Login
from sqlhelpers import one

ROOT = Path(__file__).resolve().parents[2]


class Boom(Exception):
    """Raised by the application after its enqueue, inside its atomic block."""


@pytest.fixture
def django_db(dsn: str) -> Iterator[None]:
    djangokit.use(dsn)
    try:
        yield
    finally:
        djangokit.close()


def jobs(conn: psycopg.Connection) -> list[tuple[str, str, Any]]:
    return conn.execute("SELECT queue, kind, payload FROM pgq.jobs ORDER BY id").fetchall()


# enqueue ----------------------------------------------------------------------------------------


def test_enqueue_commits_with_the_atomic_block_and_vanishes_with_its_rollback(
        django_db: None, conn: psycopg.Connection) -> None:
    from django.db import connection, transaction

    from pgq_thin.contrib.django import enqueue

    with connection.cursor() as cur:
        cur.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, item text)")
    with pytest.raises(Boom), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (item) VALUES ('rolled back')")
        enqueue("emails", "order_placed", {"order": 0})
        raise Boom
    assert jobs(conn) == []
    assert one(conn, "SELECT count(*) FROM orders") == 0

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (item) VALUES ('a book') RETURNING id")
            order_id = cur.fetchone()[0]
        job_id = enqueue("emails", "order_placed", {"order": order_id}, priority=3, max_attempts=2)
        assert jobs(conn) == []  # not before the commit
    assert jobs(conn) == [("emails", "order_placed", {"order": order_id})]
    assert conn.execute("SELECT id, priority, max_attempts FROM pgq.jobs").fetchone() == (job_id, 3, 2)
    assert one(conn, "SELECT (SELECT xmin::text FROM orders) = (SELECT xmin::text FROM pgq.jobs)")

    # Outside an atomic block, Django's autocommit commits it at once. Django's cursors bind
    # client-side: lists, intervals and JSON go through them as through a Client's.
    other = enqueue("emails", "later", None, depends_on=[job_id], tags=["vip", "eu"], max_run_time="5m",
                    meta={"from": "django"}, unique_key="later-1", using="default")
    assert conn.execute("SELECT kind, state::text, depends_on, tags, max_run_time, meta->>'from', unique_key"
                        " FROM pgq.jobs WHERE id = %s", (other,)).fetchone() == \
        ("later", "waiting", [job_id], ["eu", "vip"], timedelta(minutes=5), "django", "later-1")


def test_enqueue_takes_client_enqueues_parameters_and_refuses_what_it_refuses(
        django_db: None, dsn: str, conn: psycopg.Connection) -> None:
    from pgq_thin.contrib.django import enqueue

    client_params = dict(inspect.signature(Client.enqueue).parameters)
    del client_params["self"], client_params["conn"]
    params = dict(inspect.signature(enqueue).parameters)
    assert params.pop("using").kind is inspect.Parameter.KEYWORD_ONLY
    assert params == client_params
    assert inspect.signature(enqueue).return_annotation is int

    with Client(dsn) as client:
        for bad in ({"priority": 1.5}, {"max_run_time": "soon"}, {"depends_on": "12"}):
            with pytest.raises(BadArgument) as by_client:
                client.enqueue("emails", "x", {}, **bad)
            with pytest.raises(BadArgument) as by_django:
                enqueue("emails", "x", {}, **bad)
            assert (type(by_django.value), str(by_django.value)) == (type(by_client.value), str(by_client.value))
        with pytest.raises(Exception) as by_client:
            client.enqueue("bad queue name!", "x", {})
        with pytest.raises(Exception) as by_django:
            enqueue("bad queue name!", "x", {})
        assert (type(by_django.value), str(by_django.value)) == (type(by_client.value), str(by_client.value))
    with pytest.raises(TypeError, match="prio"):
        enqueue("emails", "x", {}, prio=1)
    assert jobs(conn) == []


def test_the_commands_database_is_djangos_unless_pgq_dsn_is_set(django_db: None, dsn: str) -> None:
    from django.test import override_settings

    from pgq_thin.contrib.django import dsn as pgq_dsn

    assert {k: v for k, v in conninfo_to_dict(pgq_dsn()).items() if k != "client_encoding"} == \
        {k: v for k, v in conninfo_to_dict(dsn).items() if k in ("dbname", "user", "password", "host", "port")}
    with override_settings(PGQ_DSN="postgresql://elsewhere/pgq"):
        assert pgq_dsn() == "postgresql://elsewhere/pgq"


# manage.py's commands ---------------------------------------------------------------------------


def test_pgq_migrate_installs_pgq_into_an_empty_database(empty_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import call_command

    djangokit.use(empty_dsn)
    try:
        call_command("pgq_migrate")
    finally:
        djangokit.close()
    assert "functions installed" in capsys.readouterr().out
    with psycopg.connect(empty_dsn) as c:
        newest = max(int(m.name[:4]) for m in (ROOT / "migrations").glob("[0-9]*.sql"))
        assert one(c, "SELECT pgq.version()") == str(newest)
        assert one(c, "SELECT count(*) FROM pgq.jobs") == 0


def test_the_inspection_commands_print_on_djangos_database(
        django_db: None, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import call_command, execute_from_command_line
    from django.core.management.base import CommandError

    with Client(dsn) as client:
        job_id = client.enqueue("reports", "monthly_report", {})
    call_command("pgq_stats")
    out = capsys.readouterr().out
    assert "reports" in out and "pending" in out
    call_command("pgq_jobs", "--", "--queue", "reports")
    listed = capsys.readouterr().out
    assert str(job_id) in listed and "monthly_report" in listed
    # As manage.py runs it: every argument is pgq-thin's, and its exit status is the process's.
    with pytest.raises(SystemExit) as ended:
        execute_from_command_line(["manage.py", "pgq_cli", "job", str(job_id)])
    assert ended.value.code == 0
    assert "monthly_report" in capsys.readouterr().out
    with pytest.raises(SystemExit) as ended:
        execute_from_command_line(["manage.py", "pgq_jobs", "--state", "nonsense"])
    assert ended.value.code == 1
    assert 'pgq-thin: error: pgq: argument "state" must be one of' in capsys.readouterr().err
    with pytest.raises(CommandError, match="exit status 1"):
        call_command("pgq_job", "--", "99999")
    assert "no job with id 99999" in capsys.readouterr().err


WORKER_APP = '''
from django.db import connection

from pgq_thin import Worker

worker = Worker(queues=["emails"])


@worker.handler("welcome")
def welcome(job, ctx):
    # The project's settings are loaded: the handler writes with Django's ORM connection.
    with connection.cursor() as cur:
        cur.execute("INSERT INTO welcomed (user_id) VALUES (%s)", [job.payload["user_id"]])
    connection.close()
'''


def test_pgq_worker_runs_a_job_to_done_inside_the_project(
        dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    settings = djangokit.settings_for({"default": djangokit.database(dsn)})
    (tmp_path / "pgqsite_settings.py").write_text(
        "import json\n" + "".join(f"{k} = json.loads({json.dumps(json.dumps(v))})\n" for k, v in settings.items())
        + 'PGQ_WORKER = "pgqsite_jobs:worker"\n')
    (tmp_path / "pgqsite_jobs.py").write_text(WORKER_APP)
    conn.execute("CREATE TABLE welcomed (user_id int)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pgqsite_settings",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(tmp_path)])}
    env.pop("PGQ_DSN", None)
    env.pop("DATABASE_URL", None)
    with Client(dsn) as client:
        job_id = client.enqueue("emails", "welcome", {"user_id": 42}, max_attempts=1)
        worker = subprocess.Popen([sys.executable, "-m", "django", "pgq_worker", "--concurrency", "1"],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            result = client.wait(job_id, timeout=60)
        except WaitTimeout:
            result = None
        finally:
            worker.send_signal(signal.SIGTERM)
            output, _ = worker.communicate(timeout=60)
    assert result is not None and result.state == "done", output
    assert worker.returncode == 0, output
    assert conn.execute("SELECT user_id FROM welcomed").fetchall() == [(42,)]


# The admin --------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(django_db: None) -> Any:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client as WebClient

    call_command("migrate", verbosity=0)
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    web = WebClient()
    web.force_login(user)
    return web


def test_the_admin_lists_jobs_and_queues_and_refuses_to_change_them(admin_client: Any, dsn: str) -> None:
    with Client(dsn) as client:
        done = client.enqueue("emails", "welcome", {})
        client.enqueue("reports", "monthly_report", {})
        job = client.claim("w1", ["emails"])[0]
        client.complete(job.id, job.attempt)
    page = admin_client.get("/admin/pgq/job/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "welcome" in text and "monthly_report" in text and "done" in text
    filtered = admin_client.get("/admin/pgq/job/", {"state": "done"}).content.decode()
    assert "welcome" in filtered and "monthly_report" not in filtered
    refused = admin_client.get("/admin/pgq/job/", {"state": "nonsense"}).content.decode()
    assert "state" in refused and "must be one of" in refused

    queues = admin_client.get("/admin/pgq/queue/")
    assert queues.status_code == 200
    assert "emails" in queues.content.decode() and "reports" in queues.content.decode()
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/pgq/job/" in index and "/admin/pgq/job/add/" not in index

    for url in ("/admin/pgq/job/add/", f"/admin/pgq/job/{done}/change/", f"/admin/pgq/job/{done}/delete/",
                "/admin/pgq/queue/add/", "/admin/pgq/queue/emails/change/", "/admin/pgq/queue/emails/delete/"):
        assert admin_client.get(url).status_code == 403, url
        assert admin_client.post(url, {"state": "done"}).status_code == 403, url


def test_the_admin_reads_as_a_pgq_monitor_login(admin_client: Any, dsn: str, login: Login) -> None:
    """Django's own tables on the "default" login, pgq read by PGQ_DATABASE's, a pgq_monitor."""
    from django.test import override_settings

    login(WATCH).close()  # makes the test's logins
    djangokit.use(dsn, pgq=djangokit.database(dsn, USER=WATCH))
    with Client(dsn) as client:
        client.enqueue("emails", "welcome", {})
    with override_settings(PGQ_DATABASE="pgq"):
        page = admin_client.get("/admin/pgq/job/").content.decode()
        assert "welcome" in page and 'class="error"' not in page
        assert "emails" in admin_client.get("/admin/pgq/queue/").content.decode()
        from django.db import connections
        assert one(connections["pgq"].connection, "SELECT current_user") == WATCH
