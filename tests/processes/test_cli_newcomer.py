"""What a newcomer tripped on at the command line (issue 42), each run as the real command against a
real database: `pgq-thin doctor` shows what is not ok and one summary line (66 lines for a healthy
database before), `pgq-thin jobs` shows when a job is due and aligns text to the left, a payload
that is JSON but not an object is refused as one that is not JSON is (same exit status, same hint
in the CLI's words; before, the first went to the server and came back with SQL in its hint), and
batches have commands: `pgq-thin batch open|close|status|cancel`."""

from __future__ import annotations

import re

import psycopg

from clikit import pgq
from sqlhelpers import claim, one

PAYLOAD_HINT = ("(hint: a payload is a JSON object in single quotes, such as '{\"to\": \"ada@example.com\"}', "
                "or - to read it from stdin)")


def test_doctor_shows_what_is_not_ok_and_one_summary_line(dsn: str, conn: psycopg.Connection) -> None:
    checks = one(conn, "SELECT count(*) FROM pgq.health()")
    healthy = pgq("doctor", dsn=dsn)
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.splitlines() == [
        f"pgq health: ok (0 critical, 0 warning, {checks} ok; --all lists every check)"]
    everything = pgq("doctor", "--all", dsn=dsn).stdout.splitlines()
    assert len(everything) == checks + 1 and all(line.startswith("[ok  ]") for line in everything[:-1])
    assert everything[-1] == f"pgq health: ok (0 critical, 0 warning, {checks} ok)"

    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [claimed] = claim(conn, queues=["q"])
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '10 minutes' WHERE id = %s", (job_id,))
    assert claimed["id"] == job_id
    sick = pgq("doctor", dsn=dsn)
    assert sick.returncode == 2
    lines = sick.stdout.splitlines()
    assert lines[0].startswith("[CRIT] expired_leases") and "hint: " in lines[1]
    assert not any(line.startswith("[ok") for line in lines)
    assert re.fullmatch(r"pgq health: critical \(1 critical, 0 warning, \d+ ok; --all lists every check\)", lines[-1])


def test_jobs_shows_run_at_and_aligns_text_to_the_left(dsn: str, conn: psycopg.Connection) -> None:
    later = one(conn, "SELECT pgq.enqueue('q', 'k', run_at => '2031-01-02 03:04:05+00')")
    other = one(conn, "SELECT pgq.enqueue('longer_queue', 'a_longer_kind')")
    listed = pgq("jobs", dsn=dsn, env={"TZ": "UTC"})
    assert listed.returncode == 0, listed.stderr
    header, _, *rows = listed.stdout.splitlines()
    assert header.split()[:7] == ["id", "queue", "kind", "state", "attempt", "run", "at"]
    by_id = {int(row.split()[0]): row for row in rows}
    assert "2031-01-02 03:04:05" in by_id[later]
    for column, texts in (("queue", {later: "q", other: "longer_queue"}),
                          ("kind", {later: "k", other: "a_longer_kind"})):
        start = header.index(column)
        for job_id, text in texts.items():
            assert by_id[job_id][start:start + len(text) + 1] == text + " ", (column, by_id[job_id])


def test_a_payload_that_is_not_an_object_is_refused_as_one_that_is_not_json(dsn: str,
                                                                            conn: psycopg.Connection) -> None:
    answers = {payload: pgq("enqueue", "q", "k", payload, dsn=dsn) for payload in ("[1, 2]", "42", '"hi"', "{to: ada}")}
    answers["stdin"] = pgq("enqueue", "q", "k", "-", dsn=dsn, stdin="null")
    answers["schedule"] = pgq("schedule", "add", "s", "q", "k", "--every", "1h", "--payload", "[]", dsn=dsn)
    for payload, answer in answers.items():
        assert answer.returncode == 2, (payload, answer.stderr)
        assert answer.stderr.count("\n") == 1 and answer.stderr.rstrip().endswith(PAYLOAD_HINT), answer.stderr
        assert "pgq." not in answer.stderr and "jsonb_build_object" not in answer.stderr
    assert "payload must be a JSON object, got an array: [1, 2]" in answers["[1, 2]"].stderr
    assert "payload must be a JSON object, got null: null" in answers["stdin"].stderr
    assert "payload is not valid JSON" in answers["{to: ada}"].stderr
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_batch_open_close_status_and_cancel(dsn: str, conn: psycopg.Connection) -> None:
    opened = pgq("batch", "open", "reports", "summarize", '{"report": 7}', dsn=dsn)
    assert opened.returncode == 0, opened.stderr
    batch = int(opened.stdout)
    members = [int(pgq("enqueue", "q", "k", "--batch", str(batch), dsn=dsn).stdout) for _ in range(2)]
    status = pgq("batch", "status", str(batch), dsn=dsn).stdout
    assert re.search(r"^state: +open$", status, re.M) and "members:      2: 2 unfinished, 0 done" in status
    assert "callback:     summarize into queue reports, when all ended" in status
    assert pgq("batch", "close", str(batch), dsn=dsn).stdout.startswith(f"batch {batch}: closed")
    assert pgq("batch", "close", str(batch), dsn=dsn).stdout == f"batch {batch}: was already closed\n"
    for job in claim(conn, queues=["q"], batch=2):
        assert job["id"] in members
        conn.execute("SELECT pgq.complete(%s, %s)", (job["id"], job["attempt"]))
    status = pgq("batch", "status", str(batch), dsn=dsn).stdout
    callback = one(conn, "SELECT id FROM pgq.jobs WHERE queue = 'reports' AND kind = 'summarize'")
    assert re.search(r"^state: +finished$", status, re.M) and f"callback job: {callback}\n" in status
    assert "members:      2: 0 unfinished, 2 done, 0 failed, 0 cancelled" in status

    other = int(pgq("batch", "open", "reports", "summarize", "--run-when", "all_done", dsn=dsn).stdout)
    waiting = int(pgq("enqueue", "q", "k", "--batch", str(other), dsn=dsn).stdout)
    cancelled = pgq("batch", "cancel", str(other), dsn=dsn)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"batch {other}: cancelled, with its callback; 1 member(s)")
    assert one(conn, "SELECT state FROM pgq.jobs WHERE id = %s", (waiting,)) == "cancelled"
    assert re.search(r"^state: +cancelled$", pgq("batch", "status", str(other), dsn=dsn).stdout, re.M)

    missing = pgq("batch", "status", "999999", dsn=dsn)
    assert missing.returncode == 1 and "P0002" in missing.stderr and missing.stderr.count("\n") == 1
    usage = pgq("batch", "close", "x", dsn=dsn)
    assert usage.returncode == 2 and "not a batch id: 'x'" in usage.stderr
