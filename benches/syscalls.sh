#!/usr/bin/env bash
# Syscalls a request, counted by `strace -c`: what the proxy asks of the
# kernel for each request, whatever its user-space instructions
# (callgrind.sh) or the packets on the wire (packets.sh). On keep-alive
# baton and HAProxy both make four, a read and a write each side.
#
#   cargo build --release && benches/syscalls.sh [keepalive|close|h2c|tcp] [baton|haproxy|nginx]
#
# The same set-up as callgrind.sh (one worker, nginx as the backend, 8
# connections of load), the proxy under `strace -f -c` from its start:
# 2 s of load once it answers, then 5 s, every syscall counted over both
# (start-up's few hundred are lost in the tens of thousands of requests).
# strace slows every syscall, so no rate means anything here; the counts
# do. Prints each syscall made at least once in a hundred requests, a
# request, and their sum. Needs strace.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=peers/one_proxy.sh
source "$root/benches/peers/one_proxy.sh"

strace -f -c -o "$work/strace.txt" "${command[@]}" >"$work/proxy.log" 2>&1 &
tracer=$!
pids+=("$tracer")
wait_until_up

warm=$(load 2)
measured=$(load 5)
# The readiness probe's request too.
requests=$((warm + measured + 1))
# The proxy is strace's child: stopped, strace writes its table and exits.
# Bounded, and strace itself stopped if the proxy cannot be found.
proxy_pid=$(pgrep -P "$tracer" || true)
kill -TERM ${proxy_pid:-$tracer} 2>/dev/null || true
for _ in $(seq 1 50); do
  kill -0 "$tracer" 2>/dev/null || break
  sleep 0.1
done
kill -KILL "$tracer" 2>/dev/null || true
wait "$tracer" 2>/dev/null || true

# strace -c's table: calls is the 4th column, the syscall the last (the
# errors column between them is empty where none failed).
awk -v r="$requests" -v who="$proxy $mode" '
  $4 ~ /^[0-9]+$/ && $NF != "total" {
    total += $4
    if ($4 / r >= 0.01) printf "  %-16s %.2f a request\n", $NF, $4 / r
  }
  END { printf "%s: requests=%d, %.2f syscalls a request\n", who, r, total / r }
' "$work/strace.txt"
