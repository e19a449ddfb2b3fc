#!/usr/bin/env bash
# edgelimit benchmark: one command from a clean clone.
#
#   bash bench/run.sh
#
# Builds the release binaries, starts a private redis-server and edgelimit servers on free
# loopback ports (nothing shared is touched), and for each algorithm measures
#   (a) Redis's own ceiling for the same Lua program: redis-benchmark EVALSHA at the same
#       concurrency, -P 1 and -P 16, keys bench:{__rand_int__} with -r (real state);
#   (b) edgelimit end to end with edgelimit-load (scenarios hot, distinct, multi), and p99
#       at half the distinct-scenario throughput;
# and prints (b)/(a). With the embedded backend (when built in) it reports decisions/s end to
# end. Every run is bounded (BENCH_SECONDS each); everything started here is stopped on exit.
#
# Settings (environment):
#   BENCH_SECONDS=10            measured seconds per run
#   BENCH_WARMUP=2s             unmeasured warm-up per load run
#   BENCH_CONCURRENCY=64        redis-benchmark clients and edgelimit-load workers
#   BENCH_ALGORITHMS="fixed_window sliding_window token_bucket"
#   BENCH_SCENARIOS="hot distinct multi"
#   BENCH_OVER_LIMIT=yes        also one subject far over its limit (fixed window, 100/hour):
#                               answered from the deny cache, Redis calls per request shown
#   BENCH_CONNECTIONS=2         edgelimit's redis.connections
#   BENCH_CONNECTION_SWEEP=""   e.g. "1 2 4 8": also measure fixed_window distinct per count
#   BENCH_MEMORY=auto           auto | yes | no: the embedded backend runs
#   BENCH_SERVER_ENV=""         extra environment for edgelimit, e.g. TOKIO_WORKER_THREADS=1
#   BENCH_EDGELIMIT_BIN=""      another edgelimit binary to measure (A/B of a server change)
#   BENCH_REDIS_EXTRA=""        extra lines for the server's redis: section, e.g. "batch_max: 1"
#                               (batching off) — one setting per line, without indentation
#   BENCH_OUT=target/bench/...  where the transcript goes (also printed)
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${BENCH_SECONDS:-10}
WARMUP=${BENCH_WARMUP:-2s}
CONC=${BENCH_CONCURRENCY:-64}
ALGORITHMS=${BENCH_ALGORITHMS:-"fixed_window sliding_window token_bucket"}
SCENARIOS=${BENCH_SCENARIOS:-"hot distinct multi"}
CONNECTIONS=${BENCH_CONNECTIONS:-2}
SWEEP=${BENCH_CONNECTION_SWEEP:-}
MEMORY=${BENCH_MEMORY:-auto}
SERVER_ENV=${BENCH_SERVER_ENV:-}
EDGE_BIN=${BENCH_EDGELIMIT_BIN:-}
REDIS_EXTRA=$(printf '%s' "${BENCH_REDIS_EXTRA:-}" | sed 's/^/  /')
mkdir -p target/bench
OUT=${BENCH_OUT:-target/bench/run-$(date +%Y%m%dT%H%M%S).txt}
: >"$OUT"

say() { echo "$*" | tee -a "$OUT"; }

for tool in redis-server redis-cli redis-benchmark; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool not found (Debian: apt-get install redis-server redis-tools)" >&2
    exit 2
  fi
done

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "== edgelimit benchmark $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(free -g | awk '/Mem:/ {print $2}') GiB"
say "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
say "redis: $(redis-server --version | cut -d' ' -f3)  revision: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "settings: ${SECS}s per run, warm-up $WARMUP, concurrency $CONC, redis.connections $CONNECTIONS${SERVER_ENV:+, server env $SERVER_ENV}"

say "-- building release binaries"
cargo build --release --locked --bins --example lua_programs 2>&1 | tail -n 2
# The programs exactly as the server composes and sends them (lua/lib is their source).
LUA_DIR="$WORK/lua"
target/release/examples/lua_programs "$LUA_DIR" >/dev/null
BIN=target/release
SERVER_BIN=${EDGE_BIN:-$BIN/edgelimit}
say "server binary: $SERVER_BIN"

# ---------------------------------------------------------------- Redis ----
# shellcheck source=bench/lib.sh
. bench/lib.sh

# --------------------------------------------------------------- edgelimit --
SECRET="$WORK/hmac.secret"
head -c 48 /dev/urandom | base64 >"$SECRET"
EDGE_ADDR=
EDGE_PID=
# start_edgelimit NAME [extra yaml lines]: listens on 127.0.0.1:0 and reads the port from its log.
start_edgelimit() {
  local name=$1 extra=${2:-}
  local config="$WORK/$name.yaml" log="$WORK/$name.log"
  cat >"$config" <<EOF
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
policy_dir: $PWD/bench/policies
hmac_secret:
  file: $SECRET
log:
  level: info
$extra
EOF
  # shellcheck disable=SC2086
  env $SERVER_ENV NO_COLOR=1 "$SERVER_BIN" serve --config "$config" >"$log" 2>&1 &
  EDGE_PID=$!
  PIDS+=("$EDGE_PID")
  await_grpc_addr "$log" "$EDGE_PID" 100 "edgelimit ($name)"
  EDGE_ADDR=$GRPC_ADDR
}
stop_edgelimit() {
  kill "$EDGE_PID" 2>/dev/null || true
  wait "$EDGE_PID" 2>/dev/null || true
}

# -------------------------------------------------------------- measuring --
# load LABEL DOMAIN SCENARIO [edgelimit-load args...]: prints the tool's summary and the CPU
# each process spent per request; sets RPS and P99.
RPS=0
P99=0
REDIS_PID=
load() {
  local label=$1 domain=$2 scenario=$3
  shift 3
  local edge0 redis0 edge1 redis1 client
  edge0=$(cpu_ticks "$EDGE_PID")
  redis0=$(cpu_ticks "$REDIS_PID")
  local TIMEFORMAT='%U %S'
  { time "$BIN/edgelimit-load" --addr "$EDGE_ADDR" --concurrency "$CONC" \
    --duration "${SECS}s" --warmup "$WARMUP" --domain "$domain" --scenario "$scenario" \
    --keys "${LOAD_KEYS:-client,route,user}" --label "$label" "$@" >"$WORK/load.out"; } 2>"$WORK/load.time"
  edge1=$(cpu_ticks "$EDGE_PID")
  redis1=$(cpu_ticks "$REDIS_PID")
  client=$(awk -v k="$TCK" '{ printf "%d", ($1 + $2) * k }' "$WORK/load.time")
  sed 's/^/    /' "$WORK/load.out" >>"$OUT"
  local result answered errors
  result=$(grep '^RESULT' "$WORK/load.out")
  RPS=$(echo "$result" | grep -o ' rps=[0-9]*' | cut -d= -f2)
  local ok over
  ok=$(echo "$result" | grep -o ' ok=[0-9]*' | cut -d= -f2)
  over=$(echo "$result" | grep -o ' over_limit=[0-9]*' | cut -d= -f2)
  P99=$(echo "$result" | grep -o ' p99_ms=[0-9.]*' | cut -d= -f2)
  errors=$(echo "$result" | grep -o ' errors=[0-9]*' | cut -d= -f2)
  answered=$(echo "$result" | grep -o ' answered=[0-9]*' | cut -d= -f2)
  say "$(printf '  %-34s %7s req/s  p99 %6s ms  errors %s  CPU us/req: edgelimit %s redis %s client %s' \
    "$label" "$RPS" "$P99" "$errors" "$(per_request_us $((edge1 - edge0)) "$answered")" \
    "$(per_request_us $((redis1 - redis0)) "$answered")" "$(per_request_us "$client" "$answered")")"
  # Every bench limit allows 10^9 per second: a run whose answers are mostly OVER_LIMIT (a
  # backend failing closed, e.g. the embedded backend at memory.max_subjects) measured
  # denials, not decisions. Runs meant to be denied set DENIALS_EXPECTED=1.
  if [ "${DENIALS_EXPECTED:-0}" != 1 ] && [ $((ok + over)) -gt 0 ] && [ $((over * 100)) -gt $((ok + over)) ]; then
    say "$(printf '  WARNING: %s: %s of %s answers were OVER_LIMIT (more than 1 %%) under limits of 10^9/s: fail-closed answers (shed, at capacity) are part of this figure' \
      "$label" "$over" "$((ok + over))")"
  fi
}

# redis_ceiling LABEL PIPELINE ARGV...: redis-benchmark EVALSHA, calibrated to run ~SECS s.
RB=0
redis_ceiling() {
  local label=$1 pipeline=$2
  shift 2
  local csv rps n
  csv=$(redis-benchmark -p "$REDIS_PORT" -c "$CONC" -n 20000 -P "$pipeline" -r 1000000 --csv "$@" | tail -n 1)
  rps=$(echo "$csv" | cut -d, -f2 | tr -d '"' | cut -d. -f1)
  n=$((rps * SECS))
  [ "$n" -ge 20000 ] || n=20000
  local redis0 redis1
  redis0=$(cpu_ticks "$REDIS_PID")
  csv=$(redis-benchmark -p "$REDIS_PORT" -c "$CONC" -n "$n" -P "$pipeline" -r 1000000 --csv "$@" | tail -n 1)
  redis1=$(cpu_ticks "$REDIS_PID")
  RB=$(echo "$csv" | cut -d, -f2 | tr -d '"' | cut -d. -f1)
  echo "    $csv" >>"$OUT"
  say "$(printf '  %-34s %9s ops/s  (%s requests)  CPU us/op: redis %s' "$label" "$RB" "$n" \
    "$(per_request_us $((redis1 - redis0)) "$n")")"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

lua_file() {
  case $1 in
    fixed_window) echo "$LUA_DIR/rate-fixed-window-v1.lua" ;;
    sliding_window) echo "$LUA_DIR/rate-sliding-counter-v1.lua" ;;
    token_bucket) echo "$LUA_DIR/rate-token-bucket-v1.lua" ;;
  esac
}
# ARGV: schema, policy id, revision, cost 1, max clock regression, grace, then the algorithm's
# parameters matching bench/policies (1e9 per second: always evaluated, always allowed).
lua_args() {
  local common="1 bench.$1 0000000000000001 1 2000 60000"
  case $1 in
    fixed_window | sliding_window) echo "$common 1000 1000000000" ;;
    token_bucket) echo "$common 1000 1000000000 1000000000" ;;
  esac
}

SUMMARY=()
start_redis
say "redis-server on 127.0.0.1:$REDIS_PORT"
start_edgelimit redis "redis:
  url: redis://127.0.0.1:$REDIS_PORT/
  connections: $CONNECTIONS
$REDIS_EXTRA"
say "edgelimit (redis backend, $CONNECTIONS connections${BENCH_REDIS_EXTRA:+, $BENCH_REDIS_EXTRA}) on $EDGE_ADDR"

for algo in $ALGORITHMS; do
  file=$(lua_file "$algo")
  if [ ! -s "$file" ]; then
    say "-- $algo: skipped ($file is empty in this revision)"
    continue
  fi
  say "-- $algo"
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  sha=$(redis-cli -p "$REDIS_PORT" -x SCRIPT LOAD <"$file")
  # shellcheck disable=SC2046
  redis_ceiling "redis-benchmark EVALSHA -P 1" 1 EVALSHA "$sha" 1 'bench:{__rand_int__}' $(lua_args "$algo")
  rb1=$RB
  # shellcheck disable=SC2046
  redis_ceiling "redis-benchmark EVALSHA -P 16" 16 EVALSHA "$sha" 1 'bench:{__rand_int__}' $(lua_args "$algo")
  rb16=$RB
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  distinct=0
  for scenario in $SCENARIOS; do
    load "edgelimit $algo $scenario" "bench_$algo" "$scenario"
    decisions=$RPS
    if [ "$scenario" = multi ]; then decisions=$((RPS * 3)); fi
    [ "$scenario" = distinct ] && distinct=$RPS
    SUMMARY+=("$(printf '%-15s %-9s %9s req/s %9s decisions/s  vs -P1 %5sx  vs -P16 %5sx  p99 %s ms' \
      "$algo" "$scenario" "$RPS" "$decisions" "$(ratio "$decisions" "$rb1")" "$(ratio "$decisions" "$rb16")" "$P99")")
  done
  if [ "$distinct" -gt 0 ]; then
    half=$((distinct / 2))
    load "edgelimit $algo distinct @${half}/s" "bench_$algo" distinct --rate "$half"
    SUMMARY+=("$(printf '%-15s %-9s %9s req/s (paced at half)              p99 %s ms' "$algo" "half" "$RPS" "$P99")")
  fi
  SUMMARY+=("$(printf '%-15s redis-benchmark ceilings: -P 1 %s ops/s, -P 16 %s ops/s' "$algo" "$rb1" "$rb16")")
done
# One abusive subject over its limit: after its first denial the deny cache answers it
# locally until the bound allows one more; the Redis calls per request show it.
if [ "${BENCH_OVER_LIMIT:-yes}" = yes ]; then
  say "-- hot subject over its limit (fixed window, 100/hour)"
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  redis-cli -p "$REDIS_PORT" CONFIG RESETSTAT >/dev/null
  DENIALS_EXPECTED=1 LOAD_KEYS=abuser load "edgelimit hot over its limit" bench_fixed_window hot
  over=$RPS
  calls=$(redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' |
    awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }')
  answered=$(grep '^RESULT' "$WORK/load.out" | grep -o ' answered=[0-9]*' | cut -d= -f2)
  SUMMARY+=("$(printf 'over-limit      hot       %9s req/s  Redis program calls %s for %s requests  p99 %s ms' \
    "$over" "$calls" "$answered" "$P99")")
fi
stop_edgelimit

if [ -n "$SWEEP" ]; then
  say "-- redis.connections sweep (fixed_window)"
  for count in $SWEEP; do
    start_edgelimit "redis-$count" "redis:
  url: redis://127.0.0.1:$REDIS_PORT/
  connections: $count"
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    load "connections=$count hot" bench_fixed_window hot
    hot=$RPS
    load "connections=$count distinct" bench_fixed_window distinct
    SUMMARY+=("$(printf 'connections=%-3s hot %9s req/s   distinct %9s req/s  p99 %s ms' "$count" "$hot" "$RPS" "$P99")")
    stop_edgelimit
  done
fi

if [ "$MEMORY" != no ]; then
  if [ "$MEMORY" = auto ] && [ ! -d src/memory ] && [ ! -d crates/memory ]; then
    say "-- memory backend: skipped (not built into this revision)"
  else
    say "-- memory backend"
    # A fresh server per algorithm, with the short cleanup grace of MEMORY_BENCH_YAML (lib.sh).
    for algo in $ALGORITHMS; do
      start_edgelimit "memory-$algo" "$MEMORY_BENCH_YAML"
      say "edgelimit (memory backend, $algo) on $EDGE_ADDR"
      for scenario in $SCENARIOS; do
        load "memory $algo $scenario" "bench_$algo" "$scenario"
        decisions=$RPS
        if [ "$scenario" = multi ]; then decisions=$((RPS * 3)); fi
        SUMMARY+=("$(printf 'memory %-8s %-9s %9s req/s %9s decisions/s end to end  p99 %s ms' \
          "${algo%%_*}" "$scenario" "$RPS" "$decisions" "$P99")")
      done
      stop_edgelimit
    done
    if "$BIN/edgelimit-load" --help | grep -q -- '--in-process'; then
      for algo in $ALGORITHMS; do
        out=$("$BIN/edgelimit-load" --in-process --policy-dir bench/policies --domain "bench_$algo" \
          --scenario distinct --subjects 100000 --duration "${SECS}s" --warmup "$WARMUP" \
          --threads "$(nproc)" --concurrency "$(nproc)" --label "memory in-process $algo")
        echo "$out" | sed 's/^/    /' >>"$OUT"
        rps=$(echo "$out" | grep '^RESULT' | grep -o ' rps=[0-9]*' | cut -d= -f2)
        SUMMARY+=("$(printf 'memory %-8s in-process %9s decisions/s (%s threads)' "${algo%%_*}" "$rps" "$(nproc)")")
      done
    fi
  fi
fi

say ""
say "== summary (ratios: edgelimit decisions/s over redis-benchmark EVALSHA ops/s, same run)"
for line in "${SUMMARY[@]}"; do say "$line"; done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
say "transcript: $OUT"
