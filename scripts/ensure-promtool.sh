#!/usr/bin/env bash
# Makes sure promtool is installed: tests/project/test_metrics_docs.py validates docs/prometheus-alerts.yml
# with it (promtool check rules, and promtool test rules on tests/promtool/alerts_test.yml).
# Installs Debian's prometheus package (which ships promtool) when it is missing and this runs as
# root; otherwise says so (those tests are then skipped, saying why).
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "promtool is missing: installing Debian's prometheus package..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package enables a Prometheus server; the tests only need promtool.
    if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
else
    echo "promtool is missing (install Debian's prometheus package): the alert rule tests will be skipped" >&2
fi
