-- Driver of a single-key program: one policy for one subject.
--
-- KEYS[1]  state hash (one key per policy, state revision and subject)
-- ARGV[1]  schema version ("1")      ARGV[2] policy id       ARGV[3] policy revision (hex)
-- ARGV[4]  cost (0 = peek: report, change nothing)
-- ARGV[5]  max clock regression ms   ARGV[6] cleanup grace ms
-- ARGV[7..] the algorithm's parameters (lua/README.md), then optionally the caller's
--          deadline in Unix ms on this server's clock: started after it, the program does
--          nothing and answers EXPIRED
--
-- Reply: { status, serverNowMillis, effectiveNowMillis, limit, remaining, retryAfterMillis,
--          resetAtMillis }, status one of ALLOWED DENIED CLOCK_UNSAFE STATE_INCOMPATIBLE INVALID
--          EXPIRED.
local c = common_args(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local p, reported_limit = ALGORITHM.params(ARGV[7], ARGV[8], ARGV[9])
local late = past(ARGV[7 + ALGORITHM.param_count])
if not c or not p or late == nil then
  return refusal('INVALID', server_now, reported_limit)
end
if late then
  return refusal('EXPIRED', server_now, reported_limit)
end
local kind, st = load(KEYS[1], ALGORITHM, c, p)
local reply, new_state, ttl = evaluate(ALGORITHM, p, c, kind, st)
-- A consuming evaluation stores its state even when denied (rolled forward, nothing added).
if new_state then store(KEYS[1], ALGORITHM, c, new_state, ttl, kind, st) end
return reply
