#!/usr/bin/env bash
# Packets a request on the wire, client side and backend side, counted by
# tcpdump on loopback: what the proxy's kernel (and its peers') must send
# and take for each request, whoever makes the syscalls.
#
#   cargo build --release && benches/packets.sh [keepalive|close|h2c|tcp] [baton|haproxy|nginx]
#
# The same set-up as callgrind.sh (one worker, nginx as the backend, 8
# connections of load), run natively: 1 s of warm-up, then 3 s captured.
# Prints packets a request on the proxy's front port and on the backend's
# port, and of those the ones carrying data (PSH). Needs tcpdump (root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=peers/one_proxy.sh
source "$root/benches/peers/one_proxy.sh"

"${command[@]}" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_until_up

load 1 >/dev/null
tcpdump -i lo -nn -q -w "$work/capture.pcap" "tcp port $front or tcp port $backend" 2>/dev/null &
capture=$!
sleep 1
requests=$(load 3)
sleep 0.5
kill "$capture"
wait "$capture" 2>/dev/null || true

count() {
  tcpdump -nn -r "$work/capture.pcap" "$1" 2>/dev/null | wc -l
}
front_all=$(count "tcp port $front")
front_data=$(count "tcp port $front and (tcp[tcpflags] & tcp-push != 0)")
backend_all=$(count "tcp port $backend")
backend_data=$(count "tcp port $backend and (tcp[tcpflags] & tcp-push != 0)")
awk -v r="$requests" -v fa="$front_all" -v fd="$front_data" -v ba="$backend_all" -v bd="$backend_data" \
  -v who="$proxy $mode" 'BEGIN {
    printf "%s: requests=%d client side %.2f packets a request (%.2f with data), backend side %.2f (%.2f)\n",
      who, r, fa / r, fd / r, ba / r, bd / r
  }'
