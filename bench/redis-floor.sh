#!/usr/bin/env bash
# What a decision's Lua program cannot go below on this machine: Redis CPU per EVALSHA of
# programs that do only the calls a decision needs and no logic, beside the real fixed-window
# program, in one private redis-server, in interleaved rounds (`INFO commandstats`
# usec_per_call, medians). The gap between the real program and the `hash` floor is what
# edgelimit's Lua logic costs; the floor itself is Redis's price per `redis.call`.
#
#   bash bench/redis-floor.sh [PROGRAM_DIR]
#
# PROGRAM_DIR holds composed programs (`cargo run --example lua_programs -- DIR`); without it
# they are composed into a scratch directory first. Knobs: FLOOR_ROUNDS (4), FLOOR_CALLS per
# round (200000), FLOOR_CLIENTS (64).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${FLOOR_ROUNDS:-4}
CALLS=${FLOOR_CALLS:-200000}
CLIENTS=${FLOOR_CLIENTS:-64}
# shellcheck source=bench/lib.sh
source bench/lib.sh
require_tools redis-server redis-cli redis-benchmark

bench_scratch

DIR=${1:-}
if [ -z "$DIR" ]; then
  DIR=$WORK/programs
  cargo run --quiet --locked --example lua_programs -- "$DIR" >/dev/null
fi
[ -f "$DIR/rate-fixed-window-v1.lua" ] || { echo "error: $DIR/rate-fixed-window-v1.lua not found" >&2; exit 2; }
start_redis

# name|script: each floor program takes the real program's key and ignores its arguments.
# `hash` is the design's state access (read the 7-field hash, write it back, set its expiry);
# `string` what a one-value state would need; `hash_x16` the state access of a batch of 16
# decisions in one call (printed per decision too).
BATCH=16
FLOORS=(
  'empty|return 1'
  'time|return redis.call("TIME")[1]'
  'hash|local t = redis.call("TIME"); local s = redis.call("HGETALL", KEYS[1]); redis.call("HSET", KEYS[1], "v", 1, "a", 1, "c", 1, "w", t[1], "r", 0, "t", t[2], "x", 0); redis.call("PEXPIRE", KEYS[1], 3600000); return 1'
  'string|local t = redis.call("TIME"); local s = redis.call("GET", KEYS[1]); redis.call("SET", KEYS[1], t[1], "PX", 3600000); return 1'
  'hash_x16|local t = redis.call("TIME"); for i = 1, #KEYS do local s = redis.call("HGETALL", KEYS[i]); redis.call("HSET", KEYS[i], "v", 1, "a", 1, "c", 1, "w", t[1], "r", 0, "t", t[2], "x", 0); redis.call("PEXPIRE", KEYS[i], 3600000) end; return 1'
)
# The arguments the server sends for one limit of 1,000,000 per hour.
ARGS="1 bench 00000000000000aa 1 1000 60000 3600000 1000000"

declare -A SHA
for floor in "${FLOORS[@]}"; do
  SHA[${floor%%|*}]=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "${floor#*|}")
done
SHA[fixed_window]=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$DIR/rate-fixed-window-v1.lua")")
NAMES=(empty time hash string hash_x16 fixed_window)
# The keys of a call: one, or BATCH distinct random ones (each placeholder is drawn anew).
ONE_KEY="1 bench:{__rand_int__}"
BATCH_KEYS="$BATCH$(for i in $(seq "$BATCH"); do printf ' bench:%d:{__rand_int__}' "$i"; done)"

# round NAME: CALLS calls on random keys, fresh stats; appends "NAME usec_per_call".
round() {
  local name=$1 usec keys=$ONE_KEY
  [ "$name" = hash_x16 ] && keys=$BATCH_KEYS
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  redis-cli -p "$REDIS_PORT" CONFIG RESETSTAT >/dev/null
  # shellcheck disable=SC2086
  redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -P 1 -n "$CALLS" -r 1000000 -q \
    EVALSHA "${SHA[$name]}" $keys $ARGS >/dev/null 2>&1
  usec=$(redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  echo "$name $usec" >>"$WORK/rounds"
}

echo "== Redis CPU per EVALSHA, $ROUNDS interleaved rounds of $CALLS calls, -c $CLIENTS -P 1"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order=("${NAMES[@]}"); else order=(); for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do order+=("${NAMES[i]}"); done; fi
  for name in "${order[@]}"; do round "$name"; done
done
awk -v names="${NAMES[*]}" -v batch="$BATCH" '
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { n[$1]++; us[$1, n[$1]] = $2 }
  END {
    k = split(names, order, " ")
    for (i = 1; i <= k; i++) {
      name = order[i]; delete v
      for (j = 1; j <= n[name]; j++) v[j] = us[name, j]
      m = median(v, n[name])
      printf "%-13s %7.2f us per call (median of %d)", name, m, n[name]
      if (name == "hash_x16") printf ", %.2f us per decision", m / batch
      printf "\n"
    }
  }' "$WORK/rounds"
