#!/usr/bin/env bash
# Runs the whole `cargo test` suite RUNS times in a row (default 10), the
# first BUSY of them (default half) with one core kept busy by `yes`, the way
# a noisy CI machine would. One line per run with its time and result; the
# output of a failed run is kept in target/stress/run-N.log. Exits non-zero
# if any run failed. Run it before landing a change to the tests or to
# anything with a timer in it.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
busy=${2:-$((runs / 2))}
mkdir -p target/stress
cargo test --no-run -q 2>&1 | tail -n 5
failed=0
for i in $(seq 1 "$runs"); do
  hog=""
  if [ "$i" -le "$busy" ]; then
    yes > /dev/null &
    hog=$!
  fi
  start=$(date +%s)
  if cargo test --no-fail-fast > "target/stress/run-$i.log" 2>&1; then
    result=passed
    rm -f "target/stress/run-$i.log"
  else
    result="FAILED (target/stress/run-$i.log)"
    failed=$((failed + 1))
  fi
  [ -n "$hog" ] && kill "$hog"
  load=$([ -n "$hog" ] && echo "busy core" || echo "quiet")
  echo "run $i/$runs ($load): $result in $(( $(date +%s) - start )) s"
done
echo "$((runs - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
