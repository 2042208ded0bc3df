"""The schedules/timeouts A/B of the benchmark still runs (tiny sizes). It asserts what was
produced, never how fast: the ratio is for bench runs to report, not for a test to judge."""

from __future__ import annotations

from pgq_tools.bench import AB_AFTER, AB_BEFORE, schedules_timeouts_ab, schedules_timeouts_ab_server


def test_the_ab_drains_a_database_before_and_one_after_migration_0004_alternately() -> None:
    result = schedules_timeouts_ab(jobs=60, workers=2, repeats=2, fsync=False)
    assert (result["before"], result["after"], result["fsync"]) == (AB_BEFORE, AB_AFTER, "off")
    assert [len(result["rates"][k]) for k in ("A", "B")] == [2, 2]
    assert all(rate > 0 for rates in result["rates"].values() for rate in rates)  # each drain's done count matched
    assert result["ratio_after_over_before"] > 0


def test_the_server_side_ab_times_both_databases() -> None:
    result = schedules_timeouts_ab_server(jobs=30, repeats=2)
    assert [len(result["us_per_claim_complete"][k]) for k in ("A", "B")] == [2, 2]
    assert result["ratio_of_mins"] > 0 and result["ratio_after_over_before"] > 0


def test_the_operators_day_ab_drains_0005_and_0006_with_and_without_kinds() -> None:
    from pgq_tools.bench import OPERATORS_AFTER, OPERATORS_BEFORE, operators_day_ab

    result = operators_day_ab(jobs=60, workers=2, repeats=3, fsync=False)
    assert (result["before"], result["after"]) == (OPERATORS_BEFORE, OPERATORS_AFTER)
    assert {k: len(v) for k, v in result["rates"].items()} == {"A": 3, "B": 3, "B kinds": 3}
    assert all(rate > 0 for rates in result["rates"].values() for rate in rates)  # each drain's count matched


def test_the_server_side_ab_by_backend_cpu_time_compares_any_two_migrations() -> None:
    from pgq_tools.bench import server_loop_cpu_ab

    result = server_loop_cpu_ab(jobs=1000, repeats=2, before="0007_failover_fence", after="0008_security_access")
    assert (result["before"], result["after"]) == ("0007_failover_fence", "0008_security_access")
    assert [len(result["cpu_us_per_claim_complete"][k]) for k in ("A", "B")] == [2, 2]
    # 1,000 claim + complete pairs take far more than one clock tick of CPU.
    assert all(us > 0 for v in result["cpu_us_per_claim_complete"].values() for us in v)
    assert result["ratio_after_over_before"] > 0


def test_the_ab_command_answers_help_and_bad_arguments_with_its_usage_not_a_traceback() -> None:
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "pgq_tools.bench", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m pgq_tools.bench")
    for bad in (["x"], ["10", "0", "1"], ["1", "2", "3", "a", "b", "c"]):
        refused = subprocess.run([sys.executable, "-m", "pgq_tools.bench", *bad], capture_output=True, text=True)
        assert refused.returncode == 2 and refused.stderr.startswith("usage:"), (bad, refused.stderr)
        assert "Traceback" not in refused.stderr


def test_a_side_of_the_ab_can_be_a_git_revision_its_migrations_and_function_source() -> None:
    """git:REV builds that revision's schema as its pgq_thin.migrate would (here the commit that
    added migration 0014 and the function source, against head)."""
    from pgq_tools.bench import server_loop_cpu_ab

    result = server_loop_cpu_ab(jobs=300, repeats=1, before="git:fa02e66", after="head")
    assert (result["before"], result["after"]) == ("git:fa02e66", "head")
    assert all(us > 0 for v in result["cpu_us_per_claim_complete"].values() for us in v)


def test_the_concerns_ab_times_a_plain_queue_beside_each_feature_it_does_not_use() -> None:
    from pgq_tools.bench import CONCERNS, concerns_ab

    result = concerns_ab(jobs=200, repeats=2, fsync=False)
    assert set(result["cpu_us_per_claim_complete"]) == set(CONCERNS) >= {
        "plain", "limits", "fairness", "schedules", "dependencies", "grants", "audit off"}
    assert all(len(v) == 2 for v in result["cpu_us_per_claim_complete"].values())  # each round's done count matched
    assert result["ratio_to_plain"]["plain"] == 1.0
