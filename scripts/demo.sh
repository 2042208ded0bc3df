#!/usr/bin/env bash
# Installs pgq with its dev extra (what the tools need) into .venv and runs the demo: on a
# throwaway PostgreSQL, or on the database given with --dsn URL. Extra arguments go to `pgq-thin demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --force-reinstall --no-deps . && .venv/bin/python -m pip install --quiet '.[dev]'
exec .venv/bin/pgq-thin demo "$@"
