#!/usr/bin/env bash
# Redis CPU per call of two versions of a composed Lua program, in wall-clock terms: one
# private redis-server runs both (SCRIPT LOAD), `redis-benchmark` drives them in interleaved
# rounds (the order alternating, so a machine whose speed drifts shifts both alike), and each
# round reads Redis's own `INFO commandstats` usec_per_call for EVALSHA and the calls per second.
# The instruction counts of bench/lua-instructions.sh say the same without the noise; this says
# what they buy in time on this machine.
#
#   bash bench/lua-ab.sh OLD_DIR NEW_DIR [PROGRAM]
#
# OLD_DIR and NEW_DIR hold composed programs (`cargo run --example lua_programs -- DIR` at each
# revision); PROGRAM is rate-fixed-window-v1 unless given (any single-key program). Knobs:
# LUA_AB_ROUNDS (6), LUA_AB_CALLS per round (100000), LUA_AB_CLIENTS (64), LUA_AB_PIPELINE (1),
# LUA_AB_KEYS (1000000: mostly new subjects; a few thousand measures subjects seen before).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: bench/lua-ab.sh OLD_DIR NEW_DIR [PROGRAM]}
NEW=${2:?usage: bench/lua-ab.sh OLD_DIR NEW_DIR [PROGRAM]}
PROGRAM=${3:-rate-fixed-window-v1}
ROUNDS=${LUA_AB_ROUNDS:-6}
CALLS=${LUA_AB_CALLS:-100000}
CLIENTS=${LUA_AB_CLIENTS:-64}
PIPELINE=${LUA_AB_PIPELINE:-1}
KEYSPACE=${LUA_AB_KEYS:-1000000}
# shellcheck source=bench/lib.sh
source bench/lib.sh
require_tools redis-server redis-cli redis-benchmark
for dir in "$OLD" "$NEW"; do
  [ -f "$dir/$PROGRAM.lua" ] || { echo "error: $dir/$PROGRAM.lua not found" >&2; exit 2; }
done

bench_scratch
start_redis

# The arguments the server sends for one limit: a window of 1,000,000 per hour, or a bucket of
# 1,000,000 refilled by 1,000 a second.
COMMON="1 bench 00000000000000aa 1 1000 60000"
case "$PROGRAM" in
  rate-token-bucket-v1) PARAMS="1000 1000 1000000" ;;
  *) PARAMS="3600000 1000000" ;;
esac

# round LABEL DIR: one run of CALLS calls on fresh counters; prints calls/s and usec_per_call.
round() {
  local label=$1 dir=$2 sha stats usec
  sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$dir/$PROGRAM.lua")")
  redis-cli -p "$REDIS_PORT" CONFIG RESETSTAT >/dev/null
  local rps
  rps=$(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -P "$PIPELINE" -n "$CALLS" -r "$KEYSPACE" \
    --csv EVALSHA "$sha" 1 'bench:{__rand_int__}' $COMMON $PARAMS 2>/dev/null |
    tail -1 | cut -d, -f2 | tr -d '"')
  stats=$(redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha:')
  usec=$(echo "$stats" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
  printf '%s %s %s\n' "$label" "$rps" "$usec" | tee -a "$WORK/rounds"
}

echo "== $PROGRAM: $OLD (old) against $NEW (new), $ROUNDS rounds of $CALLS calls," \
  "-c $CLIENTS -P $PIPELINE (label, calls/s, Redis usec_per_call)"
# Warm-up: both programs, real state for the keys the rounds will hit.
round warmup "$OLD" >/dev/null
round warmup "$NEW" >/dev/null
: >"$WORK/rounds"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then round old "$OLD"; round new "$NEW"
  else round new "$NEW"; round old "$OLD"; fi
done
awk '
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { n[$1]++; rps[$1, n[$1]] = $2; us[$1, n[$1]] = $3 }
  END {
    for (k = 1; k <= n["old"]; k++) { ro[k] = rps["old", k]; uo[k] = us["old", k] }
    for (k = 1; k <= n["new"]; k++) { rn[k] = rps["new", k]; un[k] = us["new", k] }
    mro = median(ro, n["old"]); mrn = median(rn, n["new"])
    muo = median(uo, n["old"]); mun = median(un, n["new"])
    printf "medians: old %.0f calls/s, %.2f us per call; new %.0f calls/s, %.2f us per call\n", mro, muo, mrn, mun
    printf "new/old: calls/s %.3fx, Redis us per call %.3fx\n", mrn / mro, mun / muo
  }' "$WORK/rounds"
