#!/usr/bin/env bash
# Installs pgq and its development tools (tools/: the distribution pgq-tools, beside the library)
# into .venv and runs the demo: on a throwaway PostgreSQL, or on the database given with --dsn URL.
# Extra arguments go to `pgq-thin demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# --force-reinstall --no-deps first: a second run installs this checkout again (same version number).
.venv/bin/python -m pip install --quiet --force-reinstall --no-deps . ./tools
.venv/bin/python -m pip install --quiet . ./tools
exec .venv/bin/pgq-thin demo "$@"
