"""pgq.batch_jobs (issue 42: a batch's failed member can be found): a batch's members newest first,
keyset-paged, of one state when asked; for the login that opened the batch, pgq_monitor and
pgq_admin (P0002 for anyone else, as for an unknown id); bad arguments named."""

from __future__ import annotations

import psycopg
import pytest

from loginkit import PROD, PROD2, WATCH, Login
from plankit import assert_no_seq_scan_on_jobs, capture, plan_of
from sqlhelpers import one


def ids(conn: psycopg.Connection, sql: str, params: object = None) -> list[int]:
    return [r[0] for r in conn.execute(sql, params).fetchall()]


@pytest.fixture
def batch(conn: psycopg.Connection, login: Login) -> tuple[int, list[int], psycopg.Connection]:
    """A batch opened by PROD with five members (ids ascending), the third of which failed."""
    prod = login(PROD)
    batch_id = one(prod, "SELECT pgq.batch_open('q', 'callback')")
    members = [one(prod, "SELECT pgq.enqueue('q', 'k', batch => %s)", (batch_id,)) for _ in range(5)]
    conn.execute("UPDATE pgq.jobs SET state = 'failed', finished_at = now(), last_error = 'boom' WHERE id = %s",
                 (members[2],))
    return batch_id, members, prod


def test_the_members_newest_first_page_by_page_and_of_one_state(
        batch: tuple[int, list[int], psycopg.Connection]) -> None:
    batch_id, members, prod = batch
    page = "SELECT id FROM pgq.batch_jobs(%s, limit_rows => 2, before_id => %s)"
    assert ids(prod, page, (batch_id, None)) == [members[4], members[3]]
    assert ids(prod, page, (batch_id, members[3])) == [members[2], members[1]]
    assert ids(prod, page, (batch_id, members[1])) == [members[0]]
    assert ids(prod, "SELECT id FROM pgq.batch_jobs(%s, 'failed')", (batch_id,)) == [members[2]]
    assert ids(prod, "SELECT id FROM pgq.batch_jobs(%s, 'pending')", (batch_id,)) == \
        [members[4], members[3], members[1], members[0]]


def test_a_batch_is_listed_for_its_opener_monitors_and_admins_only(
        batch: tuple[int, list[int], psycopg.Connection], login: Login) -> None:
    batch_id, members, _ = batch
    assert len(ids(login(WATCH), "SELECT id FROM pgq.batch_jobs(%s)", (batch_id,))) == 5
    with pytest.raises(psycopg.errors.NoDataFound) as info:
        login(PROD2).execute("SELECT * FROM pgq.batch_jobs(%s)", (batch_id,))
    assert f"no batch with id {batch_id}" in str(info.value)
    with pytest.raises(psycopg.errors.NoDataFound):
        login(WATCH).execute("SELECT * FROM pgq.batch_jobs(424242)")


@pytest.mark.parametrize("args,sqlstate,argument", [
    ("NULL", "22004", "id"),
    ("$B, 'finished'", "22023", "state"),
    ("$B, limit_rows => 0", "22023", "limit_rows"),
    ("$B, limit_rows => 1001", "22023", "limit_rows"),
    ("$B, limit_rows => NULL", "22004", "limit_rows"),
])
def test_a_bad_argument_is_named(batch: tuple[int, list[int], psycopg.Connection], args: str, sqlstate: str,
                                 argument: str) -> None:
    batch_id, _, prod = batch
    with pytest.raises(psycopg.Error) as info:
        prod.execute(f"SELECT * FROM pgq.batch_jobs({args.replace('$B', str(batch_id))})")
    assert info.value.sqlstate == sqlstate
    assert f'argument "{argument}"' in (info.value.diag.message_primary or "")


def test_the_page_reads_the_members_by_the_primary_key_whatever_the_statistics(
        conn: psycopg.Connection, batch: tuple[int, list[int], psycopg.Connection]) -> None:
    batch_id, members, _ = batch
    conn.execute("ANALYZE pgq.batch_members; ANALYZE pgq.jobs")  # five rows: a scan of each looks cheaper
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, "SELECT id FROM pgq.batch_jobs(%s, limit_rows => 2)", (batch_id,))
    assert [r[0] for r in rows] == [members[4], members[3]]
    plan = plan_of(plans, "FROM pgq.batch_members")
    assert "pgq.jobs" not in plan.query, plan.query  # no join to plan as a walk of every job
    assert "Index Scan Backward using batch_members_pkey" in plan.text or \
        "Index Only Scan Backward using batch_members_pkey" in plan.text, plan.text
    assert_no_seq_scan_on_jobs(plans)
