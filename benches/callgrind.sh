#!/usr/bin/env bash
# Instructions a request, counted by callgrind: exact and repeatable on a
# shared machine, where wall-clock figures vary by 10-20 % between runs.
# How every step in README "Performance" was measured.
#
#   cargo build --release && benches/callgrind.sh [keepalive|close|h2c|tcp] [baton|haproxy|nginx]
#   BATON_BIN=/path/to/another/baton benches/callgrind.sh keepalive baton   # another build (a before/after;
#   copy target/callgrind/baton-keepalive.* away between them)
#
# One worker of baton (or HAProxy, or nginx) under callgrind, nginx as the
# backend, 8 connections of load (wrk; h2load -m10 for h2c) for 10 s after
# a 3 s warm-up; counts are zeroed after the warm-up. Prints requests,
# instructions and instructions a request, and leaves the profile in
# target/callgrind/ for `callgrind_annotate` (add --inclusive=yes, or
# --tree=caller to see who calls malloc). CALLGRIND_OPTS adds options:
# CALLGRIND_OPTS=--cache-sim=yes counts simulated cache misses too
# (callgrind_annotate --sort=D1mw). Needs valgrind, wrk, h2load,
# nginx and haproxy (benches/peers/setup.sh, plus `apt-get install
# valgrind`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/callgrind
mkdir -p "$out"
# shellcheck source=peers/one_proxy.sh
source "$root/benches/peers/one_proxy.sh"

profile=$out/$proxy-$mode
rm -f "$profile" "$profile".*
valgrind --tool=callgrind ${CALLGRIND_OPTS:-} --callgrind-out-file="$profile" "${command[@]}" >"$work/proxy.log" 2>&1 &
profiled=$!
pids+=("$profiled")
wait_until_up

load 3 >/dev/null
callgrind_control -z "$profiled" >/dev/null 2>&1
requests=$(load 10)
callgrind_control -d "$profiled" >/dev/null 2>&1
sleep 1
instructions=0
for f in "$profile".*; do
  n=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')
  instructions=$((instructions + ${n:-0}))
done
echo "$proxy $mode: requests=$requests instructions=$instructions per_request=$((instructions / requests)) (profile: $profile.1)"
