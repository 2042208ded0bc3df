"""TESTING.md 21: a steady load while a REPEATABLE READ transaction holds an old snapshot. Claims
keep working during it; once it ends and VACUUM runs, pgq.jobs' dead tuples fall. The claim
latency and dead-tuple figures of each phase are printed to the terminal, not asserted: timings
on a shared 2-core machine are not a contract. PGQ_OLD_SNAPSHOT_SECONDS sets how long the
snapshot is held (default 15)."""

from __future__ import annotations

import os

import pytest

from pgq_tools.soak import old_snapshot_problems, run_old_snapshot

pytestmark = [pytest.mark.soak, pytest.mark.slow]


def test_claims_keep_working_under_an_old_snapshot_and_dead_tuples_fall_after_it_ends(
        capsys: pytest.CaptureFixture[str]) -> None:
    seconds = float(os.environ.get("PGQ_OLD_SNAPSHOT_SECONDS", "15"))
    lines: list[str] = []

    def show(line: str) -> None:
        lines.append(line)
        with capsys.disabled():
            print(line, flush=True)

    with capsys.disabled():
        print()
    phases = run_old_snapshot(seconds=seconds, print_fn=show)
    report = "\n".join(lines)
    before, during, after = phases["before"], phases["during"], phases["after"]

    assert before.claims > 0, report
    # Claims keep working while the snapshot is held.
    assert during.claims > 0, report
    # The snapshot made dead tuples pile up: the VACUUM run while it was held (the last figure of
    # the phase) could not remove the rows that changed after the snapshot was taken...
    held_after_vacuum = during.dead_tuples[-1]
    assert held_after_vacuum > 0, report
    # ...and once it ended, VACUUM could: the first figure after it is far lower.
    assert after.dead_tuples[0] < held_after_vacuum / 2, report
    assert after.claims > 0, report
    assert old_snapshot_problems(phases) == [], report
