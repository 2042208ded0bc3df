#!/usr/bin/env bash
# Makes sure PgBouncer is installed: the topology tests (tests/processes/test_topology_pgbouncer.py) start a
# real one in pool_mode = transaction in front of a throwaway server. Installs Debian's package
# when it is missing and this runs as root; otherwise says so (those tests are then skipped).
set -euo pipefail
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "pgbouncer is missing: installing Debian's pgbouncer package..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
    # The package enables a system service; the tests run their own PgBouncer, not that one.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now pgbouncer >/dev/null 2>&1 || true; fi
else
    echo "pgbouncer is missing (install Debian's pgbouncer): the PgBouncer tests will be skipped" >&2
fi
