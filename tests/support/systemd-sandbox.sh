#!/usr/bin/env bash
# A throwaway, real systemd as PID 1 of its own pid/mount/uts/ipc/cgroup
# namespaces, for the end-to-end tests in tests/systemd.rs. Needs root.
# The sandbox sees the host's files through an overlay whose writes go to a
# tmpfs (nothing it does reaches the host's disk) and shares the host's
# network namespace, so a service inside on 127.0.0.1:PORT is reachable
# from the test. /tmp and /run are its own.
#
#   systemd-sandbox.sh start DIR        boot (DIR keeps its state)
#   systemd-sandbox.sh exec  DIR CMD..  run CMD inside (systemctl, cp, ...)
#   systemd-sandbox.sh stop  DIR        kill it and clean up
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
  mount -t tmpfs tmpfs "$m/run"
  mount -t tmpfs tmpfs "$m/tmp"
  mkdir -p "$m/run/systemd/system" "$m/oldroot"
  cat > "$m/etc/systemd/system/sandbox.target" <<'UNIT'
[Unit]
Description=test sandbox
Requires=basic.target
After=basic.target
AllowIsolate=yes
UNIT
  cd "$m"
  pivot_root . oldroot
  umount -l /oldroot
  export container=other
  exec /lib/systemd/systemd --system --unit=sandbox.target --log-target=console --log-level=notice
}

case $cmd in
  start)
    mkdir -p "$dir"
    for c in $(cgroup_dirs); do mkdir -p "$c"; done
    (
      for c in $(cgroup_dirs); do echo $BASHPID > "$c/cgroup.procs"; done
      export -f boot_inside; export dir
      exec unshare --pid --fork --mount --uts --ipc --cgroup bash -c boot_inside
    ) > "$dir/console.log" 2>&1 < /dev/null &
    echo $! > "$dir/unshare.pid"
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
