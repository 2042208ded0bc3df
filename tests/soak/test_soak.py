"""TESTING.md 20, the chaos soak in its short form: producers and worker processes under kill -9,
freezes past the lease, connection kills and one immediate-mode server restart, with a synthetic
effects ledger; the invariants are checked from the database at the end (pgq_tools.soak). Its
counts are printed to the terminal.

PGQ_SOAK_MINUTES sets its length (default 1); PGQ_SOAK_SEED replays a run."""

from __future__ import annotations

import os

import pytest

from pgq_tools.soak import FAILOVERS, soak_report

pytestmark = [pytest.mark.soak, pytest.mark.slow]


def test_chaos_soak_loses_no_job_completes_none_twice_and_explains_every_duplicate_effect(
        capsys: pytest.CaptureFixture[str]) -> None:
    minutes = float(os.environ.get("PGQ_SOAK_MINUTES", "1"))
    seed = int(os.environ["PGQ_SOAK_SEED"]) if os.environ.get("PGQ_SOAK_SEED") else None
    lines: list[str] = []

    def show(line: str) -> None:
        lines.append(line)
        with capsys.disabled():  # the counts belong in the CI log
            print(line, flush=True)

    with capsys.disabled():
        print()
    code, counts = soak_report(minutes=minutes, seed=seed, print_fn=show)
    report = "\n".join(lines)

    assert code == 0, report
    # The workers' logs are gone, as a passing run leaves them.
    [log_dir] = [line.split("worker logs in ")[1].split(" (")[0] for line in lines if "worker logs in " in line]
    assert not os.path.exists(log_dir), report
    # The invariants, each stated once more on its own.
    assert counts.lost == 0, report
    assert counts.completed_twice == 0, report
    assert counts.not_terminal == 0, report
    # No two live owners: no two attempts of a job overlap while both are live (database clock),
    # over every attempt interval the run recorded, and no attempt executed twice.
    assert counts.attempts >= counts.jobs > 0, report
    assert counts.overlapping_attempts == 0 and counts.attempts_without_end == 0, report
    assert counts.executed_twice == 0 and counts.double_owners == 0, report
    # At least once: every done job was executed by the attempt that completed it; every duplicate
    # effect belongs to an attempt whose lease expired.
    assert counts.not_executed == 0, report
    assert counts.unexplained == 0 and counts.explained == counts.duplicates, report
    assert counts.acknowledged > 0 and counts.jobs >= counts.acknowledged, report
    # And the chaos happened: otherwise the run proves nothing.
    assert counts.kills > 0, report
    assert counts.connection_kills > 0, report
    assert counts.restarts == 1, report
    assert counts.reclaims > 0, report


def test_chaos_soak_across_repeated_failovers_keeps_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    """``pgq-thin soak --failover``: the same chaos on a primary with a synchronous standby, with
    FAILOVERS kill -9s of the primary and promotions instead of the restart (half the soak's time,
    at least 40 s so that every failover has room)."""
    minutes = max(float(os.environ.get("PGQ_SOAK_MINUTES", "1")) / 2, 40 / 60)
    seed = int(os.environ["PGQ_SOAK_SEED"]) if os.environ.get("PGQ_SOAK_SEED") else None
    lines: list[str] = []

    def show(line: str) -> None:
        lines.append(line)
        with capsys.disabled():
            print(line, flush=True)

    with capsys.disabled():
        print()
    code, counts = soak_report(minutes=minutes, seed=seed, print_fn=show, failover=True)
    report = "\n".join(lines)
    assert code == 0, report
    assert (counts.lost, counts.completed_twice, counts.not_terminal) == (0, 0, 0), report
    assert counts.overlapping_attempts == 0 and counts.executed_twice == 0, report
    assert counts.unexplained == 0 and counts.not_executed == 0, report
    assert counts.failovers == FAILOVERS and counts.restarts == 0, report
    assert counts.acknowledged > 0 and counts.jobs >= counts.acknowledged, report
