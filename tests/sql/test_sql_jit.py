"""A claim never pays for JIT compilation. On stale statistics (a plain VACUUM without ANALYZE,
say) a generic plan of the claim could cost more than jit_above_cost, and PostgreSQL would then
compile it on every call: about 25 ms per claim instead of about 1 ms."""

from __future__ import annotations

import psycopg


def test_a_claim_after_a_plain_vacuum_is_not_jit_compiled(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[8000]))")
    for _ in range(750):
        rows = conn.execute("SELECT id, attempt FROM pgq.claim('w', '{q}', batch => 10)").fetchall()
        conn.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
    conn.execute("VACUUM pgq.jobs")  # no ANALYZE: the statistics are now stale
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    for _ in range(3):
        conn.execute("SELECT * FROM pgq.claim('w', '{q}')").fetchall()
        conn.execute("SELECT pgq.sweep()")
    conn.execute("SET client_min_messages = notice")
    nested = [p for p in plans if "Query Text" in p]
    assert len(nested) > 10, plans
    assert not [p for p in nested if "JIT:" in p], [p for p in nested if "JIT:" in p][0]
