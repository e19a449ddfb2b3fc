#!/usr/bin/env bash
# A/B of two edgelimit server builds, interleaved, on the same machine in one run:
#
#   bash bench/ab.sh OLD_BINARY NEW_BINARY
#
# Each round starts one build, loads it, stops it, then the other (the order alternates
# between rounds), so a machine whose speed drifts during the run shifts both alike. Prints
# each run and, at the end, the medians and the new/old ratios of requests/s, server CPU per
# request (user + system, from /proc) and p99. Only the medians of interleaved rounds mean
# anything on a shared machine; a single pair does not.
#
# Knobs (environment):
#   AB_ROUNDS=6            rounds (each runs both builds once)
#   AB_SECONDS=5           seconds of load per run, after a 1 s warm-up
#   AB_BACKEND=memory      memory | redis (a private redis-server on a free loopback port)
#   AB_SCENARIO=distinct   edgelimit-load scenario: hot | distinct | multi
#   AB_CONCURRENCY=64
#   AB_DOMAIN=bench_fixed_window   a domain of bench/policies
#   AB_SERVER_ENV=""       extra environment for both servers, e.g. TOKIO_WORKER_THREADS=1
#   AB_RATE=""             requests/s of a paced (open-loop) load instead of a closed loop.
#                          At saturation the CPU per request also moves with how many answers
#                          one wake-up of the server carries; at a rate both builds sustain
#                          they do the same work at the same pace, so the CPU per request
#                          compares the code alone.
# The load generator is this checkout's release edgelimit-load (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: bash bench/ab.sh OLD_BINARY NEW_BINARY (two executable edgelimit builds)" >&2
  exit 2
fi
OLD=$1
NEW=$2
ROUNDS=${AB_ROUNDS:-6}
SECS=${AB_SECONDS:-5}
BACKEND=${AB_BACKEND:-memory}
SCENARIO=${AB_SCENARIO:-distinct}
CONC=${AB_CONCURRENCY:-64}
DOMAIN=${AB_DOMAIN:-bench_fixed_window}
SERVER_ENV=${AB_SERVER_ENV:-}
RATE_ARGS=()
[ -z "${AB_RATE:-}" ] || RATE_ARGS=(--rate "$AB_RATE")

LOAD=target/release/edgelimit-load
[ -x "$LOAD" ] || cargo build --release --locked --bin edgelimit-load 2>&1 | tail -n 1

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

head -c 48 /dev/urandom | base64 >"$WORK/secret"
# shellcheck source=bench/lib.sh
. bench/lib.sh

BACKEND_YAML=$MEMORY_BENCH_YAML
if [ "$BACKEND" = redis ]; then
  command -v redis-server >/dev/null || { echo "error: redis-server not found" >&2; exit 2; }
  start_redis
  BACKEND_YAML=$(printf 'redis:\n  url: redis://127.0.0.1:%s/' "$REDIS_PORT")
fi

# run LABEL BINARY: one server, one load; appends "label rps cpu_us p99_ms" to results.
run() {
  local label=$1 bin=$2 config="$WORK/server.yaml" log="$WORK/server.log" addr="" pid
  printf 'listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\npolicy_dir: %s\nhmac_secret:\n  file: %s\n%s\n' \
    "$PWD/bench/policies" "$WORK/secret" "$BACKEND_YAML" >"$config"
  # shellcheck disable=SC2086
  env $SERVER_ENV NO_COLOR=1 "$bin" serve --config "$config" >"$log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  await_grpc_addr "$log" "$pid" 100 "$bin"
  addr=$GRPC_ADDR
  "$LOAD" --addr "$addr" --concurrency "$CONC" --duration 1s --domain "$DOMAIN" \
    --scenario "$SCENARIO" --keys client,route,user "${RATE_ARGS[@]}" --label warmup >/dev/null
  local t0 t1 out rps p99 answered errors
  t0=$(cpu_ticks "$pid")
  out=$("$LOAD" --addr "$addr" --concurrency "$CONC" --duration "${SECS}s" --domain "$DOMAIN" \
    --scenario "$SCENARIO" --keys client,route,user "${RATE_ARGS[@]}" --label "$label" | grep '^RESULT')
  t1=$(cpu_ticks "$pid")
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rps=$(echo "$out" | grep -o ' rps=[0-9]*' | cut -d= -f2)
  p99=$(echo "$out" | grep -o ' p99_ms=[0-9.]*' | cut -d= -f2)
  answered=$(echo "$out" | grep -o ' answered=[0-9]*' | cut -d= -f2)
  errors=$(echo "$out" | grep -o ' errors=[0-9]*' | cut -d= -f2)
  local cpu
  cpu=$(per_request_us $((t1 - t0)) "$answered")
  printf '%-4s %8s req/s  %6s us/req  p99 %6s ms  errors %s\n' "$label" "$rps" "$cpu" "$p99" "$errors"
  echo "$label $rps $cpu $p99" >>"$WORK/results"
}

echo "== A/B $(date -u +%Y-%m-%dT%H:%M:%SZ): $BACKEND backend, $SCENARIO, concurrency $CONC${AB_RATE:+, paced at $AB_RATE req/s}, $ROUNDS rounds of ${SECS}s; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "old: $OLD"
echo "new: $NEW"
for round in $(seq "$ROUNDS"); do
  echo "-- round $round"
  if [ $((round % 2)) -eq 1 ]; then
    run old "$OLD"
    run new "$NEW"
  else
    run new "$NEW"
    run old "$OLD"
  fi
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$WORK/results" | median; }
echo "== medians (old -> new, ratio new/old)"
for metric in "2 req/s" "3 server CPU us/req" "4 p99 ms"; do
  c=${metric%% *}
  name=${metric#* }
  o=$(col old "$c")
  n=$(col new "$c")
  awk -v o="$o" -v n="$n" -v name="$name" 'BEGIN { printf "%-20s %10s -> %-10s %.3fx\n", name, o, n, (o > 0 ? n / o : 0) }'
done
wins=$(awk '$1 == "old" { o[++a] = $3 } $1 == "new" { n[++b] = $3 } END { w = 0; for (i = 1; i <= a; i++) if (n[i] < o[i]) w++; print w }' "$WORK/results")
echo "rounds in which new used less server CPU per request: $wins of $ROUNDS"
