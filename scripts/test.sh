#!/usr/bin/env bash
# Installs pgq with its test extras into .venv (a plain, non-editable install, as users get it)
# and runs the whole test suite against throwaway PostgreSQL servers. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --force-reinstall --no-deps . && .venv/bin/python -m pip install --quiet '.[test]'
exec .venv/bin/pytest "$@"
