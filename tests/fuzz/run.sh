#!/usr/bin/env bash
# Fuzzes baton's decoders of untrusted input for a bounded time each:
#   config    the config loader (TOML text -> Config or an error naming it)
#   messages  the handoff message and control-socket request decoders
#   h1_request   the HTTP/1 request head parser and chunked body decoder
#   h1_response  the HTTP/1 response head parser and chunked body decoder
#   proxy_header the PROXY protocol header framing and decoding
#   h2_frames    h2 frames, header block assembly and HPACK decoding
#   h2_conn      a whole h2 connection fed a client's frames
# Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET [release]]
#   default: 10 s a target of an unoptimised build, CI's share: it builds in
#   half the time of an optimised one (3.5 min cold on 2 cores, not 6.5),
#   which runs a seventh to a twentieth of the executions in that time;
#   a longer hunt: tests/fuzz/run.sh 600 release
#        tests/fuzz/run.sh build [release]
#   builds the targets and fuzzes nothing (.ci/run builds them while the
#   test suites run); a run after it builds nothing again.
# A crash leaves its input under tests/fuzz/artifacts/TARGET/ and fails the
# run; fixed crashes become cases in tests/fuzz/regressions/, which
# `cargo test` replays (tests/fuzz_regressions.rs).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
build_only=false
if [ "$seconds" = build ]; then
  build_only=true
fi
case "${2:-dev}" in
  dev) profile=--dev ;;
  release) profile=--release ;;
  *) echo "usage: $0 [SECONDS_PER_TARGET|build [release]]" >&2; exit 2 ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# cargo fuzz builds with nightly-only flags; the stable toolchain takes
# them when told it is bootstrapping the compiler.
export RUSTC_BOOTSTRAP=1
# No sanitizer: the decoders are safe Rust, so what there is to find is a
# panic or a runaway allocation, which libFuzzer reports without one.
sanitizer=(--sanitizer none)
if $build_only; then
  exec cargo fuzz build "$profile" "${sanitizer[@]}" --fuzz-dir .
fi

log="$(mktemp)"
corpus="$(mktemp -d)"
trap 'rm -rf "$log" "$corpus"' EXIT
for target in config messages h1_request h1_response proxy_header h2_frames h2_conn; do
  echo "fuzzing $target for ${seconds}s"
  rm -rf "${corpus:?}"/*
  # Seeds: the shipped example config; sample messages of each kind;
  # real request and response heads (with bodies); PROXY headers of
  # each version and kind; h2 frame sequences of each type.
  seeds="seeds/$target"
  [ "$target" = config ] && seeds=../../config
  # The connection reads the same frames (after the preface it adds).
  [ "$target" = h2_conn ] && seeds=seeds/h2_frames
  dirs=("$corpus" "$seeds")
  [ -d "regressions/$target" ] && dirs+=("regressions/$target")
  [ "$target" = h2_conn ] && dirs+=("regressions/h2_frames")
  if ! cargo fuzz run "$profile" "${sanitizer[@]}" --fuzz-dir . "$target" "${dirs[@]}" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz target $target failed; its input, if any, is under tests/fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
done
