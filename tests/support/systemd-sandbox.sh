#!/usr/bin/env bash
# A throwaway, real systemd (PID 1 of its own pid/mount/uts/ipc/cgroup
# namespaces) for the end-to-end tests in tests/systemd.rs, on a machine
# whose own PID 1 is not systemd. Needs root. The sandbox sees the host's files
# through an overlay whose writes go to a tmpfs, so nothing it does (tmpfiles
# cleaning /tmp, journald, unit files) reaches the host's disk. It shares the
# host's network namespace: a service inside that binds 127.0.0.1:PORT is
# reachable from the host at the same address. systemd runs in unified (cgroup
# v2) mode on a fresh cgroup2 mount rooted at the sandbox's own cgroup, so it
# can watch, attribute (MAINPID= from an unprivileged main) and kill a unit's
# processes as on a real host; on the host's hybrid v1 tree it could not.
#
#   systemd-sandbox.sh start DIR        boot; DIR (new or empty) keeps its state
#   systemd-sandbox.sh exec  DIR CMD..  run CMD inside (systemctl, cp, cat, ...)
#   systemd-sandbox.sh stop  DIR        kill it and clean up
#
# Inside: units go in /etc/systemd/system (write them with `exec DIR sh -c
# 'cat > ...'` or copy from a host path: host paths are visible inside), then
# `exec DIR systemctl daemon-reload`. Host paths written after boot are
# visible inside too (overlay lower layer), e.g. a freshly built binary,
# except under /tmp and /run: the sandbox has its own. Stream such files in:
# `exec DIR sh -c 'cat > /etc/x.toml' < /tmp/x.toml`.
set -euo pipefail

cmd=${1:?usage: start|exec|stop DIR ...}
dir=$(realpath -m "${2:?DIR missing}")
shift 2

cgroup_dirs() {
  local name; name=$(basename "$dir")
  for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
    [ -d "$h" ] && echo "$h/sandbox-$name"
  done
  [ -f /sys/fs/cgroup/cgroup.controllers ] && echo "/sys/fs/cgroup/sandbox-$name"
  return 0
}

boot_inside() {
  # Runs in the new namespaces: build the overlay root, pivot into it, exec systemd.
  mount --make-rprivate /
  local r=$dir/root
  mkdir -p "$r"
  mount -t tmpfs tmpfs "$r"
  mkdir -p "$r/upper" "$r/work" "$r/merged"
  mount -t overlay overlay -o "lowerdir=/,upperdir=$r/upper,workdir=$r/work" "$r/merged"
  local m=$r/merged
  mount -t proc proc "$m/proc"
  mount --rbind /sys "$m/sys"
  mount --rbind /dev "$m/dev"
  # systemd in unified (cgroup v2 only) mode: a fresh cgroup2 mount, rooted at
  # this sandbox's own cgroup (the cgroup namespace), over the host's hybrid tree.
  mount -t cgroup2 cgroup2 "$m/sys/fs/cgroup"
  mount -t tmpfs tmpfs "$m/run"
  mount -t tmpfs tmpfs "$m/tmp"
  mkdir -p "$m/run/systemd/system" "$m/oldroot"
  cat > "$m/etc/systemd/system/sandbox.target" <<'EOF'
[Unit]
Description=test sandbox
Requires=basic.target
After=basic.target
AllowIsolate=yes
EOF
  cd "$m"
  pivot_root . oldroot
  umount -l /oldroot
  export container=other
  exec /lib/systemd/systemd --system --unit=sandbox.target --log-target=console --log-level=notice
}

case $cmd in
  start)
    mkdir -p "$dir"
    # A cgroup of its own, so systemd's cgroups nest under it and go with it.
    for c in $(cgroup_dirs); do mkdir -p "$c"; done
    (
      for c in $(cgroup_dirs); do echo $BASHPID > "$c/cgroup.procs"; done
      export -f boot_inside; export dir
      exec unshare --pid --fork --mount --uts --ipc --cgroup bash -c boot_inside
    ) > "$dir/console.log" 2>&1 < /dev/null &
    echo $! > "$dir/unshare.pid"
    # Up to 30 s: a busy CI machine boots it slowly.
    for _ in $(seq 1 300); do
      pid=$(pgrep -P "$(cat "$dir/unshare.pid")" -x systemd || true)
      if [ -n "$pid" ]; then
        state=$(nsenter -t "$pid" -m -p -u -i systemctl is-system-running 2>/dev/null || true)
        case $state in running|degraded) echo "$pid" > "$dir/pid"; echo "sandbox up: pid $pid ($state)"; exit 0;; esac
      fi
      sleep 0.1
    done
    echo "sandbox did not come up; console:" >&2; cat "$dir/console.log" >&2; exit 1
    ;;
  exec)
    exec nsenter -t "$(cat "$dir/pid")" -m -p -u -i "$@"
    ;;
  stop)
    [ -f "$dir/pid" ] && kill -KILL "$(cat "$dir/pid")" 2>/dev/null || true
    [ -f "$dir/unshare.pid" ] && { wait "$(cat "$dir/unshare.pid")" 2>/dev/null || sleep 0.5; }
    for c in $(cgroup_dirs); do [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null; done
    rm -f "$dir/pid" "$dir/unshare.pid"
    echo "sandbox stopped"
    ;;
  *) echo "usage: $0 start|exec|stop DIR ..." >&2; exit 2;;
esac
