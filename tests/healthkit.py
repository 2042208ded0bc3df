"""Helpers of the health tests: the findings of pgq.health() by check."""

from __future__ import annotations

import psycopg


def findings(conn: psycopg.Connection, snapshot: str = "5 minutes",
             ready: str = "5 minutes") -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for severity, check, detail, _hint in conn.execute(
            "SELECT * FROM pgq.health(%s::interval, %s::interval)", (snapshot, ready)):
        out.setdefault(check, []).append((severity, detail))
    return out
