#!/usr/bin/env bash
# Instructions a request, counted by callgrind: exact and repeatable on a
# shared machine, where wall-clock figures vary by 10-20 % between runs.
# How every step in README "Performance" was measured.
#
#   cargo build --release && benches/callgrind.sh [keepalive|close|h2c|tcp] [baton|haproxy|nginx]
#
# One worker of baton (or HAProxy, or nginx) under callgrind, nginx as the
# backend, 8 connections of load (wrk; h2load -m10 for h2c) for 10 s after
# a 3 s warm-up; counts are zeroed after the warm-up. Prints requests,
# instructions and instructions a request, and leaves the profile in
# target/callgrind/ for `callgrind_annotate` (add --inclusive=yes, or
# --tree=caller to see who calls malloc). Needs valgrind, wrk, h2load,
# nginx and haproxy (benches/peers/setup.sh, plus `apt-get install
# valgrind`).
set -euo pipefail
mode=${1:-keepalive}
proxy=${2:-baton}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/callgrind
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
backend=$(free_port)
front=$(free_port)
admin=$(free_port)

cat >"$work/backend.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $work/backend.pid;
error_log $work/backend-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend; location / { return 200 "ok\n"; } }
}
EOF
nginx -c "$work/backend.conf" &
pids+=($!)

case $proxy in
baton)
  protocol=http
  [ "$mode" = tcp ] && protocol=tcp
  cat >"$work/baton.toml" <<EOF
workers = 1
[admin]
listen = "127.0.0.1:$admin"
[control]
socket = "$work/control.sock"
[shutdown]
pre_stop_delay = "-1s"
[[listeners]]
name = "front"
bind = "127.0.0.1:$front"
protocol = "$protocol"
pool = "app"
[[pools]]
name = "app"
backends = [{ name = "a", address = "127.0.0.1:$backend" }]
EOF
  command=("$root/target/release/baton" run --config "$work/baton.toml")
  ;;
haproxy)
  haproxy_mode=http
  [ "$mode" = tcp ] && haproxy_mode=tcp
  cat >"$work/haproxy.cfg" <<EOF
global
  nbthread 1
defaults
  mode $haproxy_mode
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend front
  bind 127.0.0.1:$front $([ "$mode" = h2c ] && echo "proto h2")
  default_backend app
backend app
  $([ "$haproxy_mode" = http ] && echo "http-reuse always")
  server a 127.0.0.1:$backend
EOF
  command=(haproxy -f "$work/haproxy.cfg")
  ;;
nginx)
  cat >"$work/proxy.conf" <<EOF
worker_processes 1;
daemon off;
master_process off;
pid $work/proxy.pid;
error_log $work/proxy-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server 127.0.0.1:$backend; keepalive 64; }
  server {
    listen 127.0.0.1:$front $([ "$mode" = h2c ] && echo "http2");
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
  command=(nginx -c "$work/proxy.conf")
  ;;
*)
  echo "unknown proxy $proxy (baton, haproxy or nginx)" >&2
  exit 2
  ;;
esac

profile=$out/$proxy-$mode
rm -f "$profile" "$profile".*
valgrind --tool=callgrind --callgrind-out-file="$profile" "${command[@]}" >"$work/proxy.log" 2>&1 &
profiled=$!
pids+=("$profiled")
for _ in $(seq 1 60); do
  curl -s -m1 -o /dev/null "http://127.0.0.1:$front/" && break
  sleep 0.5
done

load() {
  local seconds=$1
  case $mode in
  keepalive | tcp) wrk -t1 -c8 -d"$seconds" "http://127.0.0.1:$front/" | awk '/requests in/{print $1}' ;;
  close) wrk -t1 -c8 -d"$seconds" -H "Connection: close" "http://127.0.0.1:$front/" | awk '/requests in/{print $1}' ;;
  h2c) h2load -t1 -c8 -m10 -D "$seconds" "http://127.0.0.1:$front/" | awk '/^requests:/{print $4}' ;;
  *)
    echo "unknown mode $mode (keepalive, close, h2c or tcp)" >&2
    exit 2
    ;;
  esac
}
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
