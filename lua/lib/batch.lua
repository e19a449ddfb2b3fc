-- Driver of the batch program: several requests in one call, each decided on its own by the
-- composite rule (decide.lua), in order — the same as one composite call per request, one
-- after the other, at one server time. Concurrent requests bound for one Redis share one
-- script invocation (crates/redis/src/batch.rs): fewer calls for Redis to parse and dispatch.
--
-- KEYS     the requests' state hashes, request after request
-- ARGV[1]  batch protocol version ("1")
-- ARGV[2]  number of requests m (1..256)
-- ARGV[3..] per request: its number of keys (1..), mode (commit | check), number of checks n
--          (1..1024), deadline (Unix ms on this server's clock, or ''), then its n checks as in
--          the composite program (key indices 1-based into the request's own keys)
--
-- Reply: m arrays, each the request's n seven-field replies in check order. Malformed framing
-- answers one INVALID reply, which the caller cannot take for m arrays.
local m = int_arg(ARGV[2], 1, 256)
if ARGV[1] ~= '1' or not m then
  return refusal('INVALID', server_now, 0)
end
local out = {}
local kbase, i = 0, 3
for j = 1, m do
  local nkeys = int_arg(ARGV[i], 1, #KEYS - kbase)
  local mode = ARGV[i + 1]
  local n = int_arg(ARGV[i + 2], 1, 1024)
  local late = past(ARGV[i + 3])
  if not nkeys or not n or (mode ~= 'commit' and mode ~= 'check') or late == nil then
    return refusal('INVALID', server_now, 0)
  end
  out[j], i = decide_request(kbase, nkeys, i + 4, n, mode, late)
  kbase = kbase + nkeys
end
if i ~= #ARGV + 1 or kbase ~= #KEYS then
  return refusal('INVALID', server_now, 0)
end
return out
