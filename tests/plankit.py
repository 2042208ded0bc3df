"""EXPLAIN helpers: the plan of a statement, captured and checked for sequential scans of pgq.jobs."""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

WARMUP = 8


SCAN_RE = re.compile(
    r"(?P<kind>Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan)(?: Backward)?"
    r"(?: using (?P<index>\w+))? on (?:pgq\.)?jobs (?P<alias>\w+)\s+\(cost=[^)]*\)\s+"
    r"(?:\(actual time=[\d.]+\.\.[\d.]+ rows=(?P<rows>\d+(?:\.\d+)?) loops=(?P<loops>\d+)\)|\(never executed\))")


@dataclass
class Scan:
    kind: str
    index: str | None
    rows: int  # rows returned, over all loops

    def __str__(self) -> str:
        return f"{self.kind} {self.index or ''} rows={self.rows}"


@dataclass
class Plan:
    query: str
    text: str

    @property
    def job_scans(self) -> list[Scan]:
        return [Scan(m["kind"], m["index"], round(float(m["rows"] or 0) * int(m["loops"] or 0)))
                for m in SCAN_RE.finditer(self.text)]


def capture(conn: psycopg.Connection, sql: str, params=None) -> tuple[list, list[Plan]]:
    """Runs sql with auto_explain logging every nested statement; returns its rows and the plans."""
    notices: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "LOG" and diag.message_primary:
            notices.append(diag.message_primary)

    for setting in ("auto_explain.log_nested_statements = on", "auto_explain.log_analyze = on",
                    "auto_explain.log_verbose = on", "client_min_messages = log",
                    "auto_explain.log_min_duration = 0"):
        conn.execute(f"SET {setting}")
    conn.add_notice_handler(handler)
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.execute("SET client_min_messages = notice")
        conn.remove_notice_handler(handler)
    plans = []
    for n in notices:
        m = re.search(r"Query Text: (.*?)\n(?=\S+.*\(cost=)", n, re.S)
        if m:
            plans.append(Plan(m.group(1), n[m.end():]))
    assert plans, notices
    return rows, plans


def plan_of(plans: list[Plan], marker: str) -> Plan:
    found = [p for p in plans if marker in p.query]
    assert len(found) == 1, f"{marker!r} in {[p.query[:60] for p in plans]}"
    return found[0]


def assert_no_seq_scan_on_jobs(plans: list[Plan]) -> None:
    for p in plans:
        assert not any(s.kind == "Seq Scan" for s in p.job_scans), f"{p.query[:80]}\n{p.text}"
