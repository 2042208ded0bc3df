"""pgq.health on a primary sees a real standby's hot_standby_feedback (issue 40): a snapshot held by
a query on the standby holds back vacuum on the primary through the walsender's backend_xmin, and
health reports it with its age and a hint (pgq_thin.testing.topology: a real streaming standby)."""

from __future__ import annotations

import psycopg
import pytest

from pgq_thin.migrate import migrate
from pgq_thin.testing.topology import ReplicatedPair, wait_for

from healthkit import findings

pytestmark = pytest.mark.slow


def test_a_standby_query_holding_a_snapshot_is_seen_through_its_feedback() -> None:
    with ReplicatedPair(synchronous=False) as pair:
        migrate(pair.primary.dsn_for("test"))
        assert pair.standby is not None
        with psycopg.connect(pair.primary.dsn_for("test"), autocommit=True) as primary, \
                psycopg.connect(pair.standby.dsn_for("test"), autocommit=True) as standby:
            pair.wait_caught_up()
            standby.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            standby.execute("SELECT count(*) FROM pgq.jobs")  # the snapshot, held until ROLLBACK
            for _ in range(5):
                primary.execute("SELECT pgq.configure_queue('q')")  # transactions pass on the primary

            def held() -> list[tuple[str, str]] | None:
                rows = findings(primary)["standby_feedback"]
                return rows if any("standby1" in detail for _, detail in rows) else None

            rows = wait_for(held, "the standby's feedback to reach the primary")
            [(severity, detail)] = rows
            assert severity == "ok"  # young: listed, with its age
            assert "standby standby1 (walsender pid" in detail and "feeds back xmin age" in detail
            age = int(detail.split("xmin age ")[1].split(" ")[0])
            assert age >= 5
            hint = [h for _s, c, _d, h in primary.execute("SELECT * FROM pgq.health()") if c == "standby_feedback"]
            assert "hot_standby_feedback" in hint[0]
            standby.execute("ROLLBACK")
