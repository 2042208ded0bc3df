"""Issue 18, the command line: bad input gets one line on stderr and exit 2, never a traceback,
and changes nothing; and everything pgq-thin prints that came from the database or from the user
has its control characters shown as escapes, never sent to the terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgq_thin import cli

from sqlhelpers import one, wait_for

#: What no output of pgq-thin may hold: C0 controls but newline and tab, DEL, C1 controls, the
#: bidirectional overrides and isolates, the line and paragraph separators.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def pgq(*args: str | bytes, dsn: str | None = None, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full: list[str | bytes] = [sys.executable, "-m", "pgq_thin", *args]
    if dsn is not None:
        full += ["--dsn", dsn]
    return subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, errors="surrogateescape")


BAD_INPUT: list[Any] = [
    pytest.param(["prune", "--older-than", "99999999999d"], "duration too long", id="older-than-overflow"),
    pytest.param(["prune", "--older-than", "1e400s"], "not a duration", id="older-than-1e400s"),
    pytest.param(["doctor", "--max-ready-age", "99999999999d"], "duration too long", id="doctor-overflow"),
    pytest.param(["enqueue", "q", "k", "--max-run-time", "1e400s"], "not a duration", id="max-run-time"),
    pytest.param(["schedule", "add", "s", "q", "k", "--every", "9" * 400 + "d"], "duration too long", id="every"),
    pytest.param(["stats", "--watch", "1e400"], "at most 86400 seconds", id="watch-inf"),
    pytest.param(["stats", "--watch", "nan"], "at most 86400 seconds", id="watch-nan"),
    pytest.param(["stats", "--watch", "0"], "more than 0", id="watch-zero"),
    pytest.param(["enqueue", b"emails\xff", "k"], 'argument "queue"', id="queue-undecodable"),
    pytest.param(["enqueue", "q", b"k\xed\xa0\x80"], 'argument "kind"', id="kind-surrogate"),
    pytest.param(["enqueue", "q", "k", '{"a": NaN}'], "NaN is not a JSON value", id="payload-nan"),
    pytest.param(["enqueue", "q", "k", '{"a": 1e400}'], "payload", id="payload-1e400"),
    pytest.param(["enqueue", "q", "k", "{nope"], "not valid JSON", id="payload-not-json"),
    pytest.param(["enqueue", "q", "k", "-"], "nested too deeply", id="payload-100k-deep"),
    pytest.param(["enqueue", "q", "k", "--priority", "9" * 30], 'argument "priority"', id="priority-huge"),
    pytest.param(["enqueue", "q", "k", "--unique-key", b"\xff"], 'argument "unique_key"', id="unique-key"),
    pytest.param(["enqueue", "q", "k", "--depends-on", "1,x"], "not a job id", id="depends-on-not-an-id"),
    pytest.param(["enqueue", "q", "k", "--depends-on", "1,,2"], "not a comma-separated list", id="depends-on-empty"),
    pytest.param(["retry", "1", "9" * 30], "not a job id", id="retry-id"),
    pytest.param(["job", "0"], "not a job id", id="job-id-zero"),
    pytest.param(["jobs", "--before", "-5"], "not a job id", id="before"),
    pytest.param(["jobs", "--state", b"\xff"], 'argument "state"', id="state-undecodable"),
    pytest.param(["pause", b"q\xff"], 'argument "queue"', id="pause"),
    pytest.param(["no-such-command"], "invalid choice", id="unknown-command"),
    pytest.param(["migrate", "--lock-timeout", "5"], "--lock-timeout must be a duration with its unit",
                 id="lock-timeout-without-unit"),
    pytest.param(["migrate", "--lock-timeout", "5s; DROP SCHEMA pgq"], "--lock-timeout must be a duration",
                 id="lock-timeout-sql"),
]


@pytest.mark.parametrize(("argv", "said"), BAD_INPUT)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(dsn: str, conn: psycopg.Connection, argv: list[Any],
                                                          said: str) -> None:
    stdin = "[" * 100_000 + "]" * 100_000 if argv[-1] == "-" else None
    result = pgq(*argv, dsn=dsn, stdin=stdin)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert said in result.stderr and result.stdout == ""
    assert not UNSAFE.search(result.stderr)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_an_undecodable_database_address_is_one_line_exit_2() -> None:
    for given_as in ({"args": ["--dsn", b"postgresql://\xff@localhost/db"]},
                     {"env": {"PGQ_DSN": os.fsdecode(b"postgresql://\xff@localhost/db")}}):
        result = pgq("stats", *given_as.get("args", []), env=given_as.get("env"))
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "database address" in result.stderr


# Arguments as a user might type them, run in-process (fast): whatever the text, the command ends
# with 0, 1 or 2 and, when it fails, one line on stderr, never an exception.
_WORDS = st.one_of(st.text(max_size=12), st.sampled_from(["1e400", "nan", "-1", "0", "9" * 25, "99999999999d",
                                                          "1e400s", "5m", "\x1b[2J", "q", "{}", "[]", "-"]))
_COMMANDS = st.sampled_from([["enqueue", "QUEUE", "k"], ["enqueue", "q", "k", "PAYLOAD"], ["enqueue", "q", "k",
                             "--priority"], ["enqueue", "q", "k", "--max-run-time"], ["prune", "--older-than"],
                             ["prune", "--batch"], ["retry"], ["cancel"], ["job"], ["jobs", "--limit"],
                             ["jobs", "--state"], ["jobs", "--kind"], ["pause"], ["doctor", "--max-ready-age"],
                             ["sweep", "--max-jobs"], ["schedule", "add", "s", "q", "k", "--every"],
                             ["schedule", "add", "s", "q", "k", "--cron"], ["schedule", "rm"]])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=_COMMANDS, word=_WORDS)
def test_any_argument_ends_in_a_result_or_one_line_never_a_traceback(
        dsn: str, capsys: pytest.CaptureFixture[str], command: list[str], word: str) -> None:
    # (not "-" as the payload: it reads stdin, which pytest does not give)
    argv = [word if w == "QUEUE" or (w == "PAYLOAD" and word != "-") else w for w in command]
    if "QUEUE" not in command and "PAYLOAD" not in command:
        argv.append(word)
    try:
        code = cli.main([*argv, "--dsn", dsn])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    if code:
        assert err.count("\n") == 1, (argv, err)
    assert not UNSAFE.search(out + err), (argv, out, err)


# What pgq-thin prints ----------------------------------------------------------------------------

EVIL = "\x1b[31mred\x1b[0m \x1b]0;title\x07 \x9b2J \x7f\x08 \u202eevil\u202c \x0b\x0c"


def test_text_from_the_database_is_printed_with_its_control_characters_escaped(
        dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('text', %s::text), unique_key => %s)",
                 (EVIL, "key" + EVIL))
    claimed = conn.execute("SELECT id, attempt FROM pgq.claim(%s)", ("worker" + EVIL,)).fetchone()
    assert claimed is not None and claimed[0] == job_id
    conn.execute("SELECT pgq.fail(%s, %s, %s)", (job_id, claimed[1], f"Traceback:\n  line 1\r\n{EVIL}\nError{EVIL}"))
    # The API refuses such a kind or tenant; a table written some other way can still hold one.
    conn.execute("UPDATE pgq.jobs SET kind = %s, tenant = %s WHERE id = %s", ("k" + EVIL, "t" + EVIL, job_id))
    outputs = {command: pgq(*command.split(), dsn=dsn) for command in ("jobs", f"job {job_id}", "stats", "doctor")}
    for command, result in outputs.items():
        assert result.returncode in (0, 2), (command, result.stderr)
        assert not UNSAFE.search(result.stdout + result.stderr), (command, result.stdout)
    listing, detail = outputs["jobs"].stdout, outputs[f"job {job_id}"].stdout
    assert "k\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 \\x9b2J \\x7f\\x08 \\u202eevil\\u202c \\x0b\\x0c" in listing
    assert len(listing.splitlines()) == 3  # the header, its rule, one row: nothing broke a line
    # The last error keeps its lines (a traceback), and nothing else does.
    assert "last error   Traceback:\n               line 1\n             \\x1b[31mred" in detail
    for shown in ("worker\\x1b[31m", "key\\x1b[31m", "t\\x1b[31m", "\\u001b[31mred", "\\x9b2J"):
        assert shown in detail, shown
    # The history's note of several lines: summed up in its row, in full on lines of its own below.
    table, block = detail.split("history (oldest first)\n")[1].split("\n\n", 1)
    assert len(table.splitlines()) == 4 and table.splitlines()[3].endswith("Traceback: (in full below)")
    assert block.splitlines()[1:4] == ["  Traceback:", "    line 1", "  \\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 "
                                       "\\x9b2J \\x7f\\x08 \\u202eevil\\u202c \\x0b\\x0c"]


def test_an_error_message_is_printed_escaped(dsn: str) -> None:
    """pgq.pause quotes the name it refuses: the message carries the user's escape sequence."""
    result = pgq("pause", "\x1b[2J\x1b[31mq", dsn=dsn)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "\\x1b[2J\\x1b[31mq" in result.stderr and not UNSAFE.search(result.stderr)


def test_the_worker_commands_log_lines_are_escaped(dsn: str, conn: psycopg.Connection, tmp_path: Any) -> None:
    (tmp_path / "evilapp.py").write_text(
        "from pgq_thin import Worker\n"
        "worker = Worker(queues=['q'], concurrency=1, poll_interval=0.2)\n"
        "@worker.handler('k')\n"
        "def k(job, ctx):\n"
        "    raise RuntimeError(job.payload['text'])\n")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('text', %s::text), max_attempts => 1)",
                 (EVIL,))
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "evilapp:worker", "--dsn", dsn],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: one(conn, "SELECT state = 'failed' FROM pgq.jobs WHERE id = %s", (job_id,)),
                 "the job to fail")
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert "the handler raised RuntimeError('\\x1b[31mred" in err  # the repr, then the traceback's line
    assert "RuntimeError: \\x1b[31mred\\x1b[0m" in err
    assert not UNSAFE.search(out + err)


@given(st.text())
def test_clean_leaves_no_control_character_and_keeps_printable_text(text: str) -> None:
    one_line, lines = cli.clean(text), cli.clean(text, lines=True)
    assert not UNSAFE.search(one_line) and "\n" not in one_line and "\t" not in one_line
    assert not UNSAFE.search(lines)
    assert lines.count("\n") == text.replace("\r\n", "\n").count("\n")
    assert cli.clean(one_line) == one_line and cli.clean(lines, lines=True) == lines
    if text.isprintable():
        assert one_line == lines == text
