#!/usr/bin/env bash
# Instructions redis-server executes per decision for the composed Lua programs, counted by
# valgrind's callgrind: repeatable on a noisy machine (the same count for the same program,
# arguments and Redis build whatever else runs), so a change to lua/ can be measured A/B.
#
#   bash bench/lua-instructions.sh [directory of composed programs]
#
# Without an argument it composes the programs of this checkout (examples/lua_programs).
# For each case it starts a private redis-server under callgrind on a free loopback port,
# warms it up with redis-benchmark (keys bench:{__rand_int__}, -r 1000: real state), zeroes
# the counters, runs N more calls and reads the total. Needs valgrind, redis-server,
# redis-benchmark, redis-cli. About a minute per case. The first two cases are references (an
# empty program, the fixed-window program's Redis commands without its logic): the fixed-window
# count minus the second is what its Lua costs, the second minus the first its commands.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool not found" >&2; exit 2; }
done

WORK=$(mktemp -d)
VPID=
cleanup() {
  [ -n "$VPID" ] && kill "$VPID" 2>/dev/null && wait "$VPID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

LUA=${1:-}
if [ -z "$LUA" ]; then
  LUA=$WORK/lua
  cargo run --quiet --locked --example lua_programs -- "$LUA" >/dev/null
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The check arguments of one limit (a fixed or sliding window of 1,000,000 per hour): as the
# server sends them.
COMMON="1 bench 00000000000000aa 1 1000 60000"
PARAMS="3600000 1000000"
# A token bucket of 1,000,000 refilled by 1,000 every second.
TOKEN_PARAMS="1000 1000 1000000"

# measure LABEL FILE MEMBERS N KEYS... -- ARGS...: instructions per decision.
measure() {
  local label=$1 file=$2 members=$3 n=$4
  shift 4
  local port out
  port=$(free_port)
  out=$WORK/cg.$port
  valgrind --tool=callgrind --callgrind-out-file="$out.%p" redis-server --port "$port" \
    --bind 127.0.0.1 --save '' --appendonly no >"$WORK/valgrind.log" 2>&1 &
  VPID=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  local sha
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$file")")
  redis-benchmark -p "$port" -c 4 -P 4 -n 400 -r 1000 -q EVALSHA "$sha" "$@" >/dev/null 2>&1
  callgrind_control -z "$VPID" >/dev/null 2>&1
  redis-benchmark -p "$port" -c 4 -P 4 -n "$n" -r 1000 -q EVALSHA "$sha" "$@" >/dev/null 2>&1
  callgrind_control -d "$VPID" >/dev/null 2>&1
  kill "$VPID"; wait "$VPID" 2>/dev/null || true
  VPID=
  local total
  total=$(grep -h '^summary:' "$out".*.1 | awk '{print $2}')
  printf '  %-44s %9.0f instructions per decision\n' "$label" \
    "$(awk -v t="$total" -v n="$n" -v m="$members" 'BEGIN { print t / n / m }')"
}

# Two references in the same harness, so that a program's count splits into the call itself,
# the Redis commands it makes and its own Lua: a program that returns at once, and one that
# makes exactly the fixed-window program's commands on the same keys (TIME, HGETALL, HSET of
# the 7 fields of a new state or the 3 of a present one, PEXPIRE, a 7-field reply) and decides
# nothing.
cat >"$WORK/floor.lua" <<'LUA'
return 1
LUA
cat >"$WORK/commands.lua" <<'LUA'
local t = redis.call('TIME')
local all = redis.pcall('HGETALL', KEYS[1])
if #all == 0 then
  redis.call('HSET', KEYS[1], 'v', '1', 'a', 'fixed_window', 'p', 'bench', 'r', '00000000000000aa',
    'o', t[1], 'w', '1', 'c', '1')
else
  redis.call('HSET', KEYS[1], 'o', t[1], 'w', '1', 'c', '2')
end
redis.call('PEXPIRE', KEYS[1], '3600000')
return { 'ALLOWED', 1, 2, 3, 4, 5, 6 }
LUA

echo "== Lua program cost inside redis-server ($(redis-server --version | cut -d' ' -f3)), callgrind"
measure "reference: EVALSHA of 'return 1'" "$WORK/floor.lua" 1 4000 \
  1 'bench:{__rand_int__}' $COMMON $PARAMS
measure "reference: the fixed-window commands alone" "$WORK/commands.lua" 1 4000 \
  1 'bench:{__rand_int__}' $COMMON $PARAMS
measure "rate-fixed-window-v1 (one limit, alone)" "$LUA/rate-fixed-window-v1.lua" 1 4000 \
  1 'bench:{__rand_int__}' $COMMON $PARAMS
measure "rate-sliding-counter-v1" "$LUA/rate-sliding-counter-v1.lua" 1 4000 \
  1 'bench:{__rand_int__}' $COMMON $PARAMS
measure "rate-token-bucket-v1" "$LUA/rate-token-bucket-v1.lua" 1 4000 \
  1 'bench:{__rand_int__}' $COMMON $TOKEN_PARAMS
# One request of three limits, one per algorithm, each on its own key (counted per limit).
measure "rate-composite-v1, 3 limits (f, s, t)" "$LUA/rate-composite-v1.lua" 3 2000 \
  3 'bench:f:{__rand_int__}' 'bench:s:{__rand_int__}' 'bench:t:{__rand_int__}' \
  1 commit 3 '' 1 f 0 $COMMON $PARAMS 2 s 0 $COMMON $PARAMS 3 t 0 $COMMON $TOKEN_PARAMS
for m in 1 16; do
  keys=()
  args=(1 "$m")
  for _ in $(seq "$m"); do
    keys+=('bench:{__rand_int__}')
    args+=(1 commit 1 '' 1 f 0 $COMMON $PARAMS)
  done
  measure "rate-batch-v1, $m member(s) of one limit" "$LUA/rate-batch-v1.lua" "$m" \
    $((4000 / m + 100)) "$m" "${keys[@]}" "${args[@]}"
done
