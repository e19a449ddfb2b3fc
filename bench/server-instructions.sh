#!/usr/bin/env bash
# Instructions the edgelimit server executes per answered request, counted by valgrind's
# callgrind: far more repeatable on a noisy machine than CPU time (two runs of one build
# agree within about 0.5 %), so a change to the server's own code can be measured A/B.
#
#   bash bench/server-instructions.sh BINARY [BINARY...]
#
# For each build (interleaved when SI_RUNS > 1) it starts the server under callgrind on the
# embedded backend with bench/policies, loads it with this checkout's release
# edgelimit-load for SI_WARMUP seconds, zeroes the counters, loads it SI_SECONDS more and
# reads the total of that part. The count covers every thread of the server (HTTP/2, the
# runtime, the backend); the load generator runs natively. Under callgrind the server is
# ~30x slower, so a few client timeouts are normal; they are printed, and the count is
# divided by the requests the server answered.
#
# Knobs (environment):
#   SI_RUNS=2              runs of each build
#   SI_SECONDS=8           measured seconds per run
#   SI_WARMUP=2            seconds of warm-up (not counted)
#   SI_SCENARIO=distinct   edgelimit-load scenario: hot | distinct | multi
#   SI_CONCURRENCY=8
#   SI_DOMAIN=bench_fixed_window
#   SI_KEEP=DIR            keep each run's callgrind output in DIR (for callgrind_annotate)
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind callgrind_control; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool not found" >&2; exit 2; }
done
if [ $# -lt 1 ]; then
  echo "usage: bash bench/server-instructions.sh BINARY [BINARY...] (edgelimit builds)" >&2
  exit 2
fi
for bin in "$@"; do
  [ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 2; }
done
RUNS=${SI_RUNS:-2}
SECS=${SI_SECONDS:-8}
WARM=${SI_WARMUP:-2}
SCENARIO=${SI_SCENARIO:-distinct}
CONC=${SI_CONCURRENCY:-8}
DOMAIN=${SI_DOMAIN:-bench_fixed_window}

LOAD=target/release/edgelimit-load
[ -x "$LOAD" ] || cargo build --release --locked --bin edgelimit-load 2>&1 | tail -n 1

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_scratch
trap 'exit 130' INT TERM
head -c 48 /dev/urandom | base64 >"$WORK/secret"

# count BINARY: one server under callgrind; sets TOTAL, ANSWERED and ERRORS.
count() {
  local bin=$1 dir="$WORK/run" addr="" pid out
  rm -rf "$dir" && mkdir -p "$dir"
  printf 'listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npolicy_dir: %s\nhmac_secret:\n  file: %s\n%s\n' \
    "$PWD/bench/policies" "$WORK/secret" "$MEMORY_BENCH_YAML" >"$dir/server.yaml"
  NO_COLOR=1 valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
    "$bin" serve --config "$dir/server.yaml" >"$dir/server.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  # Under valgrind the start takes seconds.
  await_grpc_addr "$dir/server.log" "$pid" 600 "$bin under valgrind"
  addr=$GRPC_ADDR
  local load=("$LOAD" --addr "$addr" --concurrency "$CONC" --domain "$DOMAIN"
    --scenario "$SCENARIO" --keys client,route,user)
  "${load[@]}" --duration "${WARM}s" --label warmup >/dev/null
  callgrind_control --zero "$pid" >/dev/null 2>&1
  out=$("${load[@]}" --duration "${SECS}s" --label measured | grep '^RESULT')
  # The dump holds what ran since the zeroing: the measured load alone.
  callgrind_control --dump "$pid" >/dev/null 2>&1
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ANSWERED=$(echo "$out" | grep -o ' answered=[0-9]*' | cut -d= -f2)
  ERRORS=$(echo "$out" | grep -o ' errors=[0-9]*' | cut -d= -f2)
  TOTAL=$(grep -h '^summary:' "$dir"/cg.out.* 2>/dev/null | head -n1 | awk '{print $2}' || true)
  [ -n "$TOTAL" ] || { echo "error: no callgrind dump for $bin" >&2; exit 1; }
  if [ -n "${SI_KEEP:-}" ]; then
    mkdir -p "$SI_KEEP"
    KEPT=$((${KEPT:-0} + 1))
    # The first dump is the measured load's (the one TOTAL is read from).
    cp "$(ls "$dir"/cg.out.* | head -n1)" "$SI_KEEP/$KEPT.cg"
    echo "kept $SI_KEEP/$KEPT.cg: $bin"
  fi
}

echo "== server instructions per request $(date -u +%Y-%m-%dT%H:%M:%SZ): embedded backend, $SCENARIO, $DOMAIN, concurrency $CONC, ${SECS}s after ${WARM}s; valgrind $(valgrind --version)"
for run in $(seq "$RUNS"); do
  for bin in "$@"; do
    count "$bin"
    awk -v b="$bin" -v t="$TOTAL" -v n="$ANSWERED" -v e="$ERRORS" -v r="$run" \
      'BEGIN { printf "run %d  %-40s %12.0f instructions/request  (%d answered, %d client errors)\n", r, b, (n > 0 ? t / n : 0), n, e }'
  done
done
