"""Rate limits (issue 11): a queue's claims hand out at most rate_limit jobs per rate_period (a
burst of at most rate_limit, then rate_limit per rate_period: its tokens come one every
rate_period / rate_limit, each good for one rate_period, kept in slices, pgq.rate_slices, since
issue 37), and at most key_rate_limit per rate_period of one concurrency_key (a GCRA bucket per
key), by the rate clock (pgq._rate_clock). Time is moved with the test clock (clockdb.py); the
race tests run on the real clock. A queue's slices are made ahead of their time by its claims and
enqueues: the tests set the clock before they enqueue."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from sqlhelpers import claim, one, wait_for

T0 = datetime.fromisoformat("2030-01-01 12:00:00+00:00")


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def enqueue(conn: psycopg.Connection, queue: str, n: int, key: str | None = None, tenant: str | None = None,
            kind: str = "k") -> None:
    conn.execute("SELECT pgq.enqueue_many(%s, %s, array_fill('{}'::jsonb, ARRAY[%s]), tenant => %s, "
                 "concurrency_key => %s)", (queue, kind, n, tenant, key))


def claimed_keys(conn: psycopg.Connection, got: list[dict[str, Any]]) -> Counter[str | None]:
    ids = [c["id"] for c in got]
    rows = conn.execute("SELECT concurrency_key FROM pgq.jobs WHERE id = ANY (%s)", (ids,)).fetchall()
    return Counter(r[0] for r in rows)


def complete_all(conn: psycopg.Connection, got: list[dict[str, Any]]) -> None:
    for c in got:
        conn.execute("SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"]))


# Burst, then the sustained rate -------------------------------------------------------------------


def test_a_burst_of_rate_limit_then_one_token_per_period_over_rate(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 5, rate_period => '10 seconds')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 30)
    assert len(claim(conn, queues=["api"], batch=10)) == 5  # the burst
    assert claim(conn, queues=["api"], batch=10) == []  # no token: fewer (none), no error
    set_clock(conn, at(1.999))
    assert claim(conn, queues=["api"], batch=10) == []
    set_clock(conn, at(2))  # one token per 2 s
    assert len(claim(conn, queues=["api"], batch=10)) == 1
    assert claim(conn, queues=["api"], batch=10) == []
    set_clock(conn, at(7))  # 2.5 tokens since: 2
    assert len(claim(conn, queues=["api"], batch=10)) == 2
    set_clock(conn, at(100))  # idle for long: the bucket holds at most rate_limit
    # (...in slices that nothing made ahead meanwhile: the first claim makes them, and takes none,
    # since no transaction spends from slices only it made; the next takes the burst.)
    assert claim(conn, queues=["api"], batch=10) == []
    assert len(claim(conn, queues=["api"], batch=10)) == 5
    assert claim(conn, queues=["api"], batch=10) == []


def test_a_claim_of_ten_with_three_tokens_returns_three(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 3, rate_period => '1 minute')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 20)
    assert len(claim(conn, queues=["api"], batch=10)) == 3
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 3


def test_the_default_period_is_one_second(conn: psycopg.Connection) -> None:
    settings = conn.execute("SELECT rate_limit, rate_period, rate_limited FROM pgq.configure_queue('api', "
                            "rate_limit => 2)").fetchone()
    assert settings == (2, timedelta(seconds=1), True)
    set_clock(conn, at(0))
    enqueue(conn, "api", 10)
    assert len(claim(conn, queues=["api"], batch=10)) == 2
    set_clock(conn, at(0.5))
    assert len(claim(conn, queues=["api"], batch=10)) == 1


def test_tokens_are_spent_only_for_jobs_handed_out(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 5, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 2)
    assert len(claim(conn, queues=["api"], batch=10)) == 2  # only 2 jobs: 2 tokens
    assert conn.execute("SELECT * FROM pgq.claim('w', '{api}', batch => 10, kinds => '{other}')").fetchall() == []
    enqueue(conn, "api", 10)
    enqueue(conn, "plain", 10)
    # A claim across queues whose batch the other queue's better jobs fill spends no token.
    conn.execute("UPDATE pgq.jobs SET priority = 5 WHERE queue = 'plain'")
    got = claim(conn, queues=["api", "plain"], batch=4)
    assert Counter(c["queue"] for c in got) == {"plain": 4}
    assert len(claim(conn, queues=["api"], batch=10)) == 3  # 5 - 2


def test_release_snooze_and_fail_give_no_token_back(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 3, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 6)
    a, b, c = claim(conn, queues=["api"], batch=3)
    conn.execute("SELECT pgq.release(%s, %s)", (a["id"], a["attempt"]))
    conn.execute("SELECT pgq.snooze(%s, %s, '1 second')", (b["id"], b["attempt"]))
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', retry_in => '1 second')", (c["id"], c["attempt"]))
    set_clock(conn, at(2))  # all due again; 3 per hour: no new token yet
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending' AND run_at <= pgq._now()") == 6
    assert claim(conn, queues=["api"], batch=10) == []


def test_a_claim_of_all_queues_skips_a_rate_limited_queue_without_tokens(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 1, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 3)
    enqueue(conn, "plain", 3)
    got = claim(conn, queues=None, batch=10)
    assert Counter(c["queue"] for c in got) == {"plain": 3, "api": 1}
    assert claim(conn, queues=None, batch=10) == []


# Per-key rate limits ------------------------------------------------------------------------------


def test_key_rate_limit_per_key_leaves_other_keys_and_unkeyed_jobs_alone(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_rate_limit => 2, rate_period => '10 seconds')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 5, key="a")
    enqueue(conn, "api", 5, key="b")
    enqueue(conn, "api", 3)
    got = claim(conn, queues=["api"], batch=20)
    assert claimed_keys(conn, got) == {"a": 2, "b": 2, None: 3}
    assert claim(conn, queues=["api"], batch=20) == []
    enqueue(conn, "api", 3, key="c")  # a new key has its whole burst
    assert claimed_keys(conn, claim(conn, queues=["api"], batch=20)) == {"c": 2}
    set_clock(conn, at(5))  # one token per key per 5 s
    assert claimed_keys(conn, claim(conn, queues=["api"], batch=20)) == {"a": 1, "b": 1, "c": 1}
    assert claim(conn, queues=["api"], batch=20) == []


def test_a_key_without_tokens_never_blocks_the_keys_behind_it(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_rate_limit => 1, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 4, key="a")  # the oldest jobs share key a
    [first] = claim(conn, queues=["api"])
    for key in "bcdefghijklm":
        enqueue(conn, "api", 1, key=key)
    got = claim(conn, queues=["api"], batch=10)
    assert sorted(claimed_keys(conn, got)) == list("bcdefghijk")


def test_queue_and_key_rate_limits_together(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 5, key_rate_limit => 2, "
                 "rate_period => '10 seconds')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 5, key="a")
    enqueue(conn, "api", 5, key="b")
    enqueue(conn, "api", 5, key="c")
    got = claim(conn, queues=["api"], batch=20)
    assert len(got) == 5 and max(claimed_keys(conn, got).values()) == 2


def test_key_rate_limits_with_key_concurrency_limits(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_max_running => 1, key_rate_limit => 2, "
                 "rate_period => '1 hour')")
    conn.execute("SELECT pgq.set_key_limit('api', 'big', 5)")
    set_clock(conn, at(0))
    enqueue(conn, "api", 6, key="a")
    enqueue(conn, "api", 6, key="big")
    got = claim(conn, queues=["api"], batch=20)
    assert claimed_keys(conn, got) == {"a": 1, "big": 2}  # a: its slot; big: its tokens
    complete_all(conn, got)
    got = claim(conn, queues=["api"], batch=20)
    assert claimed_keys(conn, got) == {"a": 1}  # big has no token left, a its second
    complete_all(conn, got)
    assert claim(conn, queues=["api"], batch=20) == []


def test_rate_limits_with_max_running(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', max_running => 3, rate_limit => 7, rate_period => '70 seconds')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 20)
    got = claim(conn, queues=["api"], batch=10)
    assert len(got) == 3  # the cap
    complete_all(conn, got)
    got = claim(conn, queues=["api"], batch=10)
    assert len(got) == 3
    complete_all(conn, got)
    assert len(claim(conn, queues=["api"], batch=10)) == 1  # 7 tokens in all
    assert claim(conn, queues=["api"], batch=10) == []


@pytest.mark.parametrize("keyed", [False, True])
def test_rate_limits_with_fair_mode(conn: psycopg.Connection, keyed: bool) -> None:
    conn.execute("SELECT pgq.configure_queue('api', fair => true, rate_limit => 4, rate_period => '1 hour', "
                 "key_rate_limit => %s)", (1 if keyed else 0,))
    set_clock(conn, at(0))
    for i, tenant in enumerate(["t1", "t2"]):
        for key in ("a", "b", "c"):
            enqueue(conn, "api", 3, key=f"{key}{i}", tenant=tenant)
    got = claim(conn, queues=["api"], batch=10)
    assert Counter(c["tenant"] for c in got) == {"t1": 2, "t2": 2}
    if keyed:
        assert max(claimed_keys(conn, got).values()) == 1
    assert claim(conn, queues=["api"], batch=10) == []


def test_kinds_and_rate_limits(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 2, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 3, kind="x")
    enqueue(conn, "api", 3, kind="y")
    got = conn.execute("SELECT kind FROM pgq.claim('w', '{api}', batch => 10, kinds => '{y}')").fetchall()
    assert got == [("y",), ("y",)]
    assert conn.execute("SELECT kind FROM pgq.claim('w', '{api}', batch => 10, kinds => '{x}')").fetchall() == []


# Settings ----------------------------------------------------------------------------------------


def test_a_new_rate_keeps_what_was_handed_out_as_tokens_of_the_new_rate(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 10, rate_period => '10 seconds')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 50)
    assert len(claim(conn, queues=["api"], batch=50)) == 10
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 20)")  # 10 of 20 tokens spent
    assert len(claim(conn, queues=["api"], batch=50)) == 10
    assert claim(conn, queues=["api"], batch=50) == []
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 5)")  # more spent than a bucket holds: empty
    set_clock(conn, at(1.999))
    assert claim(conn, queues=["api"], batch=50) == []
    set_clock(conn, at(2))  # a token per 2 s from an empty bucket
    assert len(claim(conn, queues=["api"], batch=50)) == 1
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 0)")  # no limit: its state is forgotten
    assert one(conn, "SELECT (rate_limited, rate_tat) FROM pgq.queues WHERE name = 'api'") == ("f", None)
    assert one(conn, "SELECT count(*) FROM pgq.rate_slices") == 0
    assert len(claim(conn, queues=["api"], batch=50)) == 50 - 21


# Slices: a rate's tokens spent side by side (issue 25), held by their spender alone (issue 37) ----


def slices(conn: psycopg.Connection, queue: str = "api") -> list[tuple[int, int]]:
    """(slice, taken) of the queue's slices, in order."""
    return [(r[0], r[1]) for r in conn.execute("SELECT slice, taken FROM pgq.rate_slices WHERE queue = %s "
                                                "ORDER BY slice", (queue,)).fetchall()]


def test_a_rates_slices_are_made_ahead_of_their_time_in_stripes(conn: psycopg.Connection) -> None:
    """A rate's tokens are in stripes (one per 100 tokens a second, at most 16, as the shards were)
    of slices of a few tokens (about 16 slices a period per stripe), made for the window of the
    tokens good now and those due within max(period, 10 s)."""
    set_clock(conn, at(0))
    for rate, period, stripes, size in [(50, "1 minute", 1, 4), (250, "1 second", 2, 8), (3001, "1 second", 16, 12)]:
        conn.execute("SELECT pgq.configure_queue('api', rate_limit => %s, rate_period => %s)", (rate, period))
        assert one(conn, "SELECT pgq._stripes(%s, %s)", (rate, period)) == stripes
        assert one(conn, "SELECT pgq._slice_size(%s, %s)", (rate, period)) == size
        made = [n for n, _ in slices(conn)]
        assert made == list(range(made[0], made[-1] + 1))  # one row each, no gap, whole blocks
        block = stripes * size
        seconds = max(timedelta(seconds=10), timedelta(minutes=1) if period == "1 minute" else timedelta(seconds=1))
        first, last = conn.execute(
            "SELECT (pgq._token_number(%(r)s, %(p)s, %(t)s) - %(r)s + 1) / %(b)s * %(m)s, "
            "pgq._token_number(%(r)s, %(p)s, %(t)s::timestamptz + %(s)s) / %(b)s * %(m)s + %(m)s - 1",
            {"r": rate, "p": period, "t": at(0), "b": block, "m": stripes, "s": seconds}).fetchone()
        assert (made[0], made[-1]) == (first, last)
        assert one(conn, "SELECT count(DISTINCT tokens) FROM pgq.rate_slices WHERE queue = 'api'") == 1
    assert one(conn, "SELECT rate_tat FROM pgq.queue_settings('api')") is None  # nothing taken


def test_one_claim_takes_the_whole_burst_across_the_slices_then_the_rate(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 400, rate_period => '1 second')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 1000)
    assert len(claim(conn, queues=["api"], batch=1000)) == 400
    assert claim(conn, queues=["api"], batch=1000) == []
    assert one(conn, "SELECT rate_tat FROM pgq.queue_settings('api')") == T0 + timedelta(seconds=1)
    set_clock(conn, at(0.5))  # a token every 2.5 ms
    assert len(claim(conn, queues=["api"], batch=1000)) == 200
    row = conn.execute("SELECT held_by_rate_limit, next_token_at FROM pgq.queue_limits('api')").fetchone()
    assert row == (400, T0 + timedelta(seconds=0.5025))  # 400 due jobs held; the next token in 2.5 ms


def test_claimers_of_a_fast_rate_limit_spend_side_by_side(dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811 (clockdb's dsn)
    """A claim of a rate-limited queue locks only the slices it spends: while one claim's
    transaction stays open, another claim takes every token but those of the slice the first one
    took from, at once (it used to find the queue's row held and get nothing; then, in shards, the
    three shards the first one did not hold)."""
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 400, rate_period => '1 second')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 1000)
    with psycopg.connect(dsn) as first:  # a transaction left open after its claim
        assert len(claim(first, queues=["api"], batch=1)) == 1
        with psycopg.connect(dsn, autocommit=True) as second:
            second.execute("SET statement_timeout = '10s'")  # a wait would fail here, not hang
            got = len(claim(second, queues=["api"], batch=1000))
            assert 400 - 7 <= got <= 399  # all but the first's slice (4 stripes of slices of 7 tokens)
        first.rollback()
    assert len(claim(conn, queues=["api"], batch=1000)) == 400 - got  # the first's slice, given back whole


def test_changing_another_setting_keeps_the_rate_state(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 2, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 5)
    assert len(claim(conn, queues=["api"], batch=5)) == 2
    conn.execute("SELECT pgq.configure_queue('api', lease => '1 minute', max_running => 100)")
    assert claim(conn, queues=["api"], batch=5) == []


def test_key_rate_limit_zero_forgets_the_keys_and_the_queue_is_plain_again(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_rate_limit => 1, rate_period => '1 hour')")
    set_clock(conn, at(0))
    enqueue(conn, "api", 3, key="a")
    assert len(claim(conn, queues=["api"], batch=5)) == 1
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 1
    row = conn.execute("SELECT rate_limited, key_rate_limit FROM pgq.configure_queue('api', key_rate_limit => 0)")
    assert row.fetchone() == (False, 0)
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 0
    assert len(claim(conn, queues=["api"], batch=5)) == 2


def test_sweep_and_prune_delete_the_keys_whose_bucket_is_full_again(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_rate_limit => 2, rate_period => '10 seconds')")
    set_clock(conn, at(0))
    for key in "abc":
        enqueue(conn, "api", 1, key=key)
    enqueue(conn, "api", 2, key="d")
    assert len(claim(conn, queues=["api"], batch=10)) == 5
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 4
    set_clock(conn, at(5))  # a, b, c full again (one token each, taken 5 s ago); d not yet
    conn.execute("SELECT pgq.sweep()")
    assert conn.execute("SELECT key FROM pgq.key_rates").fetchall() == [("d",)]
    set_clock(conn, at(10))
    conn.execute("SELECT pgq.prune()")
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 0
    # And a deleted row is as a full bucket: d has its burst again.
    enqueue(conn, "api", 3, key="d")
    assert len(claim(conn, queues=["api"], batch=10)) == 2


def test_drop_queue_removes_its_rate_state(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', key_rate_limit => 2, rate_period => '1 hour')")
    enqueue(conn, "api", 1, key="a")
    [c] = claim(conn, queues=["api"])
    conn.execute("SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"]))
    conn.execute("SELECT pgq.prune(older_than => '0')")
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 1
    assert one(conn, "SELECT pgq.drop_queue('api')") is True
    assert one(conn, "SELECT count(*) FROM pgq.key_rates") == 0


def test_a_rate_limited_claim_must_run_at_read_committed(dsn: str) -> None:  # noqa: F811 (clockdb's dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgq.configure_queue('api', rate_limit => 2)")
        c.execute("SELECT pgq.enqueue('api', 'k')")
    with psycopg.connect(dsn) as c:
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("SELECT * FROM pgq.claim('w', '{api}')")


@pytest.mark.parametrize("call, argument, sqlstate", [
    ("SELECT pgq.configure_queue('q', rate_limit => -1)", "rate_limit", "22023"),
    ("SELECT pgq.configure_queue('q', rate_limit => 1000001)", "rate_limit", "22023"),
    ("SELECT pgq.configure_queue('q', key_rate_limit => -1)", "key_rate_limit", "22023"),
    ("SELECT pgq.configure_queue('q', key_rate_limit => 1000001)", "key_rate_limit", "22023"),
    ("SELECT pgq.configure_queue('q', rate_period => '0')", "rate_period", "22023"),
    ("SELECT pgq.configure_queue('q', rate_period => '-1 second')", "rate_period", "22023"),
    ("SELECT pgq.configure_queue('q', rate_period => '1 day 1 second')", "rate_period", "22023"),
    ("SELECT pgq.configure_queue('q', rate_period => '1 mon')", "rate_period", "22023"),
    ("SELECT pgq.configure_queue('q', rate_period => '1 day -1 hour')", "rate_period", "22023"),
    ("SELECT pgq.queue_limits('no-such-queue')", "queue", "22023"),
])
def test_bad_arguments_are_refused_and_write_nothing(conn: psycopg.Connection, call: str, argument: str,
                                                     sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(call)
    assert err.value.sqlstate == sqlstate and f'"{argument}"' in err.value.diag.message_primary
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0


def test_a_bad_argument_leaves_an_existing_queues_limits_unchanged(conn: psycopg.Connection) -> None:
    before = conn.execute("SELECT * FROM pgq.configure_queue('q', rate_limit => 5, rate_period => '1 minute')"
                          ).fetchone()
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT pgq.configure_queue('q', rate_limit => 7, rate_period => '2 days')")
    assert conn.execute("SELECT * FROM pgq.queues WHERE name = 'q'").fetchone() == before


def test_the_queues_check_refuses_bad_limits_written_around_configure_queue(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q')")
    for change in ["rate_limit = -1", "key_rate_limit = 2000000", "rate_period = '0'", "rate_period = '2 days'"]:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE pgq.queues SET {change} WHERE name = 'q'")


# What the limits hold back -----------------------------------------------------------------------


def limits(conn: psycopg.Connection, queue: str | None = None) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT * FROM pgq.queue_limits(%s)", (queue,))
    return [dict(zip([d.name for d in cur.description], r)) for r in cur.fetchall()]


def test_queue_limits_counts_what_each_limit_holds_back(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 4, rate_period => '8 seconds', "
                 "key_rate_limit => 2, max_running => 10, key_max_running => 3)")
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 2)")
    conn.execute("SELECT pgq.enqueue('plain', 'k')")  # no limit: not listed
    set_clock(conn, at(0))
    enqueue(conn, "api", 3, key="a")
    enqueue(conn, "api", 1)
    assert len(claim(conn, queues=["api"], batch=10)) == 3  # a: 2 (its tokens), the unkeyed one
    enqueue(conn, "api", 4, key="a")
    enqueue(conn, "api", 2, key="b")
    enqueue(conn, "api", 1)
    enqueue(conn, "capped", 5)
    claim(conn, queues=["capped"], batch=10)
    set_clock(conn, at(1))
    # api: 1 token left (4 - 3, 1 s of 2 s towards the next); due: a 5, b 2, none 1 = 8;
    # running 3 (a 2); a: 1 free slot, no token; b: 3 free slots, 2 tokens.
    [api, capped] = limits(conn)
    assert api == {
        "queue": "api", "paused": False, "ready": 8, "running": 3, "max_running": 10, "key_max_running": 3,
        "rate_limit": 4, "rate_period": timedelta(seconds=8), "key_rate_limit": 2,
        "held_by_max_running": 8 - 7, "held_by_key_limit": 5 - 1, "held_by_rate_limit": 8 - 1,
        "held_by_key_rate_limit": 5, "next_token_at": None, "next_key_token_at": T0 + timedelta(seconds=4),
    }
    assert capped["queue"] == "capped" and (capped["ready"], capped["running"]) == (3, 2)
    assert (capped["held_by_max_running"], capped["held_by_rate_limit"]) == (3, 0)
    assert claimed_keys(conn, claim(conn, queues=["api"], batch=10)) == {"b": 1}  # the one token: the oldest
    [api] = limits(conn, "api")
    assert api["held_by_rate_limit"] == 7 and api["next_token_at"] == T0 + timedelta(seconds=2)
    assert limits(conn, "plain")[0]["held_by_rate_limit"] == 0


def test_rate_limit_wait_says_how_long_until_the_next_token(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 2, rate_period => '10 seconds')")
    conn.execute("SELECT pgq.configure_queue('keyed', key_rate_limit => 1, rate_period => '1 minute')")
    conn.execute("SELECT pgq.configure_queue('paused', rate_limit => 2)")
    conn.execute("SELECT pgq.pause('paused')")
    set_clock(conn, at(0))

    def waits(queues: list[str] | None = None) -> dict[str, float]:
        rows = conn.execute("SELECT queue, wait FROM pgq.rate_limit_wait(%s)", (queues,)).fetchall()
        return {q: w.total_seconds() for q, w in rows}

    assert waits() == {"api": 0, "keyed": 0}
    assert waits(["api", "plain"]) == {"api": 0}
    enqueue(conn, "api", 5)
    enqueue(conn, "keyed", 2, key="a")
    claim(conn, queues=["api", "keyed"], batch=10)
    set_clock(conn, at(1))
    assert waits() == {"api": 4, "keyed": 59}


# Races ------------------------------------------------------------------------------------------


def _bound_holds(claims: list[tuple[datetime, int]], burst: int, period: float, grid: int = 0) -> list[str]:
    """The rate's bound, checked on every window of the claims (sorted by when they handed out):
    the claims after the i-th up to the j-th read the rate clock within [e_i, e_j] (each reads it
    after the one before committed, and before its own events), so they took at most
    burst + floor((e_j - e_i) * burst / period) tokens (a key's GCRA bucket), or one more
    (``grid`` 1: a queue's tokens, due on a fixed grid, one every period / burst: a claim right
    after a grid point may take the token due then, though the one before took the last of the
    burst just before it)."""
    claims = sorted(claims)
    over = []
    for i in range(len(claims)):
        taken = 0
        for j in range(i + 1, len(claims)):
            taken += claims[j][1]
            window = (claims[j][0] - claims[i][0]).total_seconds()
            if taken > burst + int(window * burst / period + 1e-9) + grid:
                over.append(f"{taken} jobs in {window:.4f} s after claim {i}")
    return over


@pytest.mark.parametrize("fair", [False, True])
@pytest.mark.parametrize("rate, key_rate, period, done", [
    (3, 1, 0.2, 60),        # small bursts, one shard: a token handed out twice passes the bound
    (400, 100, 1.0, 800),   # four shards (issue 25), spent side by side: together never above the rate
])
def test_many_concurrent_claimers_never_pass_the_rate_limits(dsn: str, conn: psycopg.Connection, fair: bool,  # noqa: F811 (clockdb's dsn)
                                                             rate: int, key_rate: int, period: float,
                                                             done: int) -> None:
    """8 claimers hammer pgq.claim (each call a worker name of its own) on a queue with a rate
    limit and a key rate limit; every window of the claimed events keeps both bounds."""
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => %s, key_rate_limit => %s, "
                 "rate_period => make_interval(secs => %s), fair => %s)", (rate, key_rate, period, fair))
    for i, key in enumerate(["a", "b", "c", "d", None]):
        enqueue(conn, "api", 200, key=key, tenant=f"t{i % 2}")
    stop = threading.Event()
    errors: list[BaseException] = []
    calls = Counter[int]()

    barrier = threading.Barrier(8)

    def claimer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                barrier.wait(30)
                n = 0
                while not stop.is_set():
                    n += 1
                    rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, '{api}', batch => %s)",
                                     (f"w{seed}-{n}", rng.randint(1, 3))).fetchall()
                    calls[seed] += 1
                    for job_id, attempt in rows:
                        c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") >= done,
             f"{done} jobs done", timeout=120)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert sum(calls.values()) > 100  # the claimers really did hammer (most claims found no token)
    rows = conn.execute("SELECT e.worker, min(e.at), j.concurrency_key, count(*) FROM pgq.job_events AS e "
                        "JOIN pgq.jobs AS j ON j.id = e.job_id WHERE e.event = 'claimed' "
                        "GROUP BY e.worker, j.concurrency_key").fetchall()
    per_claim: dict[str, list[Any]] = defaultdict(lambda: [None, 0])
    per_key: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for worker, first, key, n in rows:
        entry = per_claim[worker]
        entry[0] = first if entry[0] is None else min(entry[0], first)
        entry[1] += n
        if key is not None:
            per_key[key].append((first, n))
    assert sum(n for _, n in per_claim.values()) >= done
    assert not _bound_holds([(e, n) for e, n in per_claim.values()], rate, period, grid=1)
    for key, claims in per_key.items():
        assert not _bound_holds(claims, key_rate, period), key
    # ...and the limit was the one that held: the claims came as fast as the bound allows, give or
    # take (a wide margin: the machine is shared).
    times = sorted(e for e, _ in per_claim.values())
    span = (times[-1] - times[0]).total_seconds()
    assert sum(n for _, n in per_claim.values()) >= (span * rate / period) * 0.3


def test_claimers_at_the_same_moment_share_one_burst(dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811 (clockdb's dsn)
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 3, rate_period => '1 hour')")
    enqueue(conn, "api", 50)
    barrier = threading.Barrier(8)
    held: list[int] = [0] * 8

    def first_claim(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait(30)
            for _ in range(20):
                held[i] += len(c.execute("SELECT id FROM pgq.claim('w', '{api}', batch => 3)").fetchall())

    starters = [threading.Thread(target=first_claim, args=(i,)) for i in range(8)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(timeout=60)
    assert sum(held) == 3, held


# The cost for queues without limits --------------------------------------------------------------


def test_a_queue_without_rate_limits_never_reads_their_state(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('other', key_rate_limit => 1)")  # rate limits exist elsewhere
    conn.execute("SET track_functions = 'pl'")
    enqueue(conn, "plain", 20, key="a")
    conn.execute("SELECT pg_stat_force_next_flush()")

    def reads() -> tuple[int, int]:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        scans = one(conn, "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
                          "WHERE relid = 'pgq.key_rates'::regclass")
        calls = one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                          "WHERE schemaname = 'pgq' AND funcname IN ('_spend_tokens', '_keyed_pick', '_rate_clock')")
        return scans, calls

    before = reads()
    for _ in range(5):
        assert len(claim(conn, queues=["plain"], batch=4)) == 4
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert reads() == before
    # ...while a rate-limited queue's claim does (so the check above can fail).
    enqueue(conn, "other", 1, key="a")
    assert len(claim(conn, queues=["other"])) == 1
    conn.execute("SELECT pg_stat_force_next_flush()")
    after = reads()
    assert after[0] > before[0] and after[1] > before[1]


def test_pgq_thin_stats_shows_what_the_limits_hold_back(dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811 (clockdb's dsn)
    from pgq_thin.durations import parse_duration

    from clikit import pgq

    conn.execute("SELECT pgq.enqueue('plain', 'k')")
    plain = pgq("stats", dsn=dsn)
    assert plain.returncode == 0 and "held back" not in plain.stdout  # no queue has a limit
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 2, rate_period => '1 hour')")
    enqueue(conn, "api", 5)
    assert len(claim(conn, queues=["api"], batch=10)) == 2
    limited = pgq("stats", dsn=dsn)
    assert limited.returncode == 0, limited.stderr
    lines = limited.stdout.splitlines()
    assert "held back by limits" in limited.stdout
    [row] = [line.split() for line in lines[lines.index(next(x for x in lines if "held back" in x)):]
             if line.startswith("api ")]
    assert row[:7] == ["api", "3", "2", "0", "0", "3", "0"]  # ready, running, held by max_running ...
    next_token = parse_duration(" ".join(row[7:])).total_seconds()  # written as durations are: 29m 59s
    assert 0 < next_token <= 1800  # the next token: within 30 minutes (one due every 30 minutes)


def test_the_exporter_serves_what_the_limits_hold_back(conn: psycopg.Connection) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from pgq_thin import metrics

    conn.execute("SELECT pgq.configure_queue('api', rate_limit => 2, rate_period => '1 hour', max_running => 4)")
    enqueue(conn, "api", 7)
    enqueue(conn, "plain", 3)  # no limit: no series
    assert len(claim(conn, queues=["api"], batch=10)) == 2
    body, _ = metrics.exposition(conn)
    held = {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(body.decode()) if f.name == "pgq_jobs_held_back"
            for s in f.samples}
    assert held == {(("limit", limit), ("queue", "api")): n for limit, n in
                    [("max_running", 3.0), ("key_limit", 0.0), ("rate_limit", 5.0), ("key_rate_limit", 0.0)]}
