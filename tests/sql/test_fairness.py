"""Tenant-fair claiming: in fair mode a tenant's backlog cannot delay another tenant's jobs."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from sqlhelpers import one


def claim_and_finish(conn: psycopg.Connection, queues: str = "{q}", n: int = 1) -> list[tuple[int, str]]:
    """One claim of batch n; the claimed jobs are completed at once. Returns (id, tenant) pairs."""
    rows = conn.execute("SELECT id, attempt, tenant FROM pgq.claim('w', %s::text[], batch => %s)",
                        (queues, n)).fetchall()
    for job_id, attempt, _ in rows:
        assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt))
    return [(job_id, tenant) for job_id, _, tenant in rows]


def flood(conn: psycopg.Connection, tenant: str, n: int, queue: str = "q") -> None:
    conn.execute("SELECT pgq.enqueue_many(%s, 'k', array_fill('{}'::jsonb, ARRAY[%s]), tenant => %s)",
                 (queue, n, tenant))


@pytest.mark.parametrize("fair", [True, False])
def test_a_big_backlog_does_not_delay_another_tenants_ten_jobs_in_fair_mode(
        conn: psycopg.Connection, fair: bool) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => %s, audit => false)", (fair,))
    flood(conn, "A", 100_000)
    flood(conn, "B", 10)
    first_20 = [tenant for _ in range(20) for _, tenant in claim_and_finish(conn)]
    if fair:
        assert first_20.count("B") == 10, first_20
    else:
        assert first_20.count("B") == 0, first_20  # without fair mode B waits behind A's 100k


def test_within_a_tenant_the_total_order_holds(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => true)")
    low = [one(conn, "SELECT pgq.enqueue('q', 'k', tenant => 'A')") for _ in range(3)]
    high = one(conn, "SELECT pgq.enqueue('q', 'k', priority => 5, tenant => 'A')")
    flood(conn, "B", 4)
    a_order = [job_id for _ in range(8) for job_id, tenant in claim_and_finish(conn) if tenant == "A"]
    assert a_order == [high, *low]


def test_weights_share_claims_in_proportion(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => true, audit => false)")
    flood(conn, "A", 1000)
    flood(conn, "B", 1000)
    conn.execute("SELECT pgq.set_tenant_weight('q', 'A', 3)")
    counts = Counter(tenant for _ in range(40) for _, tenant in claim_and_finish(conn))
    assert counts == {"A": 30, "B": 10}


def test_a_batch_claim_is_shared_between_tenants(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => true)")
    flood(conn, "A", 100)
    flood(conn, "B", 100)
    flood(conn, "C", 2)
    counts = Counter(tenant for _, tenant in claim_and_finish(conn, n=9))
    assert counts in ({"A": 3, "B": 3, "C": 2}, {"A": 4, "B": 3, "C": 2}, {"A": 3, "B": 4, "C": 2})


def test_a_tenant_back_from_idle_gets_its_share_not_a_burst(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => true, audit => false)")
    flood(conn, "A", 400)
    flood(conn, "B", 1)
    for _ in range(30):
        claim_and_finish(conn, n=10)  # A runs alone for a while (B's one job goes early)
    flood(conn, "B", 100)
    next_20 = [tenant for _ in range(20) for _, tenant in claim_and_finish(conn)]
    assert 9 <= next_20.count("B") <= 11, next_20


def test_jobs_without_a_tenant_in_a_fair_queue_are_one_more_tenant(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', fair => true)")
    flood(conn, "A", 50)
    anonymous = [one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(2)]
    assert {one(conn, "SELECT tenant FROM pgq.jobs WHERE id = %s", (i,)) for i in anonymous} == {""}
    first_4 = [job_id for _ in range(4) for job_id, _ in claim_and_finish(conn)]
    assert set(anonymous) <= set(first_4)


def test_switching_to_fair_mode_adopts_the_jobs_already_queued(conn: psycopg.Connection) -> None:
    flood(conn, "A", 30)
    waiting = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("SELECT pgq.configure_queue('q', fair => true)")
    assert one(conn, "SELECT tenant FROM pgq.jobs WHERE id = %s", (waiting,)) == ""
    assert sorted(r[0] for r in conn.execute("SELECT tenant FROM pgq.tenants WHERE queue = 'q'")) == ["", "A"]
    first_2 = [job_id for _ in range(2) for job_id, _ in claim_and_finish(conn)]
    assert waiting in first_2


def test_a_claim_over_several_queues_is_fair_within_the_fair_one(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('f', fair => true)")
    flood(conn, "A", 50, queue="f")
    flood(conn, "B", 50, queue="f")
    flood(conn, "Z", 50, queue="plain")
    claimed = claim_and_finish(conn, queues="{f,plain}", n=20)
    fair_part = Counter(t for job_id, t in claimed if t in ("A", "B"))
    assert abs(fair_part["A"] - fair_part["B"]) <= 1 and sum(fair_part.values()) > 0


def test_queues_not_in_fair_mode_keep_no_tenant_bookkeeping(conn: psycopg.Connection) -> None:
    flood(conn, "A", 10)
    claim_and_finish(conn, n=5)
    assert one(conn, "SELECT count(*) FROM pgq.tenants") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE tenant = 'A'") == 10


def test_tenant_weight_bad_input_is_refused(conn: psycopg.Connection) -> None:
    for args, sqlstate, name in ((("q", "A", 0), "22023", "weight"), (("q", "A", None), "22004", "weight"),
                                 (("q", None, 2), "22004", "tenant"), (("bad q", "A", 2), "22023", "queue")):
        with pytest.raises(psycopg.Error) as err:
            conn.execute("SELECT pgq.set_tenant_weight(%s, %s, %s)", args)
        assert err.value.sqlstate == sqlstate and f'"{name}"' in err.value.diag.message_primary
    assert one(conn, "SELECT count(*) FROM pgq.tenants") == 0
