# Helpers shared by the bench scripts (sourced, not run). The caller sets WORK (a scratch
# directory) and PIDS (an array its exit trap kills), or has `bench_scratch` set both.

# require_tools TOOL...: exit 2 naming the first one not on PATH.
require_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool not found" >&2; exit 2; }
  done
}

# bench_scratch: a fresh WORK and an empty PIDS, both cleaned up when the script exits.
bench_cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
bench_scratch() {
  WORK=$(mktemp -d)
  PIDS=()
  trap bench_cleanup EXIT
}

# start_redis: a private redis-server on a free loopback port; sets REDIS_PORT and REDIS_PID.
REDIS_PORT=
start_redis() {
  local attempt port pid
  for attempt in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 40000))
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --protected-mode yes --dir "$WORK" --logfile "$WORK/redis.log" &
    pid=$!
    for _ in $(seq 50); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      # Verify it is *our* server that answers (another one may hold the port).
      if redis-cli -p "$port" info server 2>/dev/null | grep -q "^process_id:$pid"; then
        PIDS+=("$pid")
        REDIS_PORT=$port
        REDIS_PID=$pid
        return 0
      fi
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "error: could not start redis-server on a free port" >&2
  exit 1
}

# await_grpc_addr LOG PID TENTHS WHAT: the address the server logs as `grpc_addr=`, waiting up
# to TENTHS tenths of a second; sets GRPC_ADDR. When the server ends or never logs it, prints
# "WHAT did not start" and its log, and exits 1.
GRPC_ADDR=
await_grpc_addr() {
  local log=$1 pid=$2 tries=$3 what=$4
  GRPC_ADDR=
  for _ in $(seq "$tries"); do
    GRPC_ADDR=$(sed -e 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'grpc_addr=127\.0\.0\.1:[0-9]*' | head -n1 | cut -d= -f2 || true)
    [ -z "$GRPC_ADDR" ] || return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "error: $what did not start:" >&2
  cat "$log" >&2
  exit 1
}

# CPU time (user + system, clock ticks) a process has used so far.
TCK=$(getconf CLK_TCK)
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12 + $13}' || echo 0; }
per_request_us() { awk -v t="$1" -v k="$TCK" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t / k / n * 1e6; else print "n/a" }'; }

# The embedded backend as the benchmarks run it: a cleanup grace of 1 s instead of the default
# 60 s, so a one-second window's state goes 2 s after it began and the subjects a run creates
# (up to ~150,000 per second in multi) stay under memory.max_subjects (1,000,000), beyond which
# new subjects fail closed and a run would measure denials.
MEMORY_BENCH_YAML=$(printf 'backend: memory\npolicies:\n  cleanup_grace: 1s')
