#!/usr/bin/env bash
# Makes sure PostgreSQL's server programs (initdb, postgres) are installed; the tests and the demo
# start their own throwaway server with them. Installs Debian's package when they are missing.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL's server programs are missing: installing Debian's postgresql package..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
else
    echo "PostgreSQL's server programs (initdb, postgres) are missing: install PostgreSQL 15 or newer" >&2
    exit 1
fi
