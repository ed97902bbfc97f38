#!/usr/bin/env bash
# Installs the peers the benchmarks compare baton with, and the load tools,
# from Debian's packages. Run as root: benches/peers/setup.sh
set -euo pipefail
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy nginx wrk nghttp2-client util-linux
# The packages start their own services where an init runs; the benches
# start their own instances, so stop those if they came up.
systemctl stop haproxy nginx 2>/dev/null || true
