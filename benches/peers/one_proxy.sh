# Sourced by callgrind.sh, packets.sh and syscalls.sh (BATON_BIN names
# another baton than target/release/baton): one proxy (baton, HAProxy or
# nginx, one worker) in front of an nginx backend on loopback, as the
# benches' tables measure it. Reads $1 (mode: keepalive, close, h2c or tcp)
# and $2 (proxy); sets $front, $backend, $work and `command` (the proxy's
# command line, for the caller to start), and defines `load SECONDS`,
# which prints the requests made (wrk -c8, or h2load -c8 -m10 for h2c),
# and `wait_until_up`, which waits for the proxy to answer.
mode=${1:-keepalive}
proxy=${2:-baton}
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
  command=("${BATON_BIN:-$root/target/release/baton}" run --config "$work/baton.toml")
  ;;
haproxy)
  # The four fields baton adds by default, as throughput's peers add them.
  haproxy_same_fields='  option forwardfor
  http-request set-header X-Forwarded-Proto http
  unique-id-format %{+X}o\ %pid-%rt
  unique-id-header X-Request-Id
  http-request add-header Via "1.1 haproxy"'
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
$([ "$haproxy_mode" = http ] && printf '%s\n' "$haproxy_same_fields")
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
    location / {
      proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$remote_addr; proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Request-Id \$request_id; proxy_set_header Via "1.1 nginx";
    }
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

wait_until_up() {
  for _ in $(seq 1 60); do
    curl -s -m1 -o /dev/null "http://127.0.0.1:$front/" && return
    sleep 0.5
  done
}
