-- Driver of the composite program: every limit of one request decided together. The request
-- is admitted only if every enforced check is ALLOWED; then the state of every check that
-- was ALLOWED is stored, otherwise nothing is (a denied request consumes nothing). Shadow
-- checks never change admission; one that would deny stores nothing either.
--
-- Checks run in request order against each key's working state, so a key named twice sees
-- the first check's tentative consumption. A key's state is read once, with the policy of the
-- first check naming it (the caller names a key only with the policy it was derived from).
-- When the request is not admitted, a check that was ALLOWED reports a peek of its key as it
-- was before the request: what is left now.
--
-- KEYS     the distinct state hashes of the request (one Cluster slot)
-- ARGV[1]  composite protocol version ("1")
-- ARGV[2]  mode: "commit" (store when admitted) or "check" (never store; reply as for a
--          request that is not admitted: the read-only first phase across Cluster slots)
-- ARGV[3]  number of checks n (1..1024)
-- ARGV[4]  the caller's deadline in Unix ms on this server's clock, or '' for none: started
--          after it, the program does nothing and answers EXPIRED for every check
-- ARGV[5..] per check:
--          key index (1-based into KEYS), algorithm (f fixed window | s sliding counter |
--          t token bucket), shadow (0 | 1), the six common arguments of the single-key
--          programs, and the algorithm's parameters (2 for f and s, 3 for t).
--
-- Reply: n seven-field replies, in check order. Malformed framing answers one INVALID reply,
-- which the caller cannot take for n of them.
local n = int_arg(ARGV[3], 1, 1024)
local mode = ARGV[2]
local late = past(ARGV[4])
if ARGV[1] ~= '1' or not n or (mode ~= 'commit' and mode ~= 'check') or late == nil then
  return refusal('INVALID', server_now, 0)
end
local replies, after = decide_request(0, #KEYS, 5, n, mode, late)
if after ~= #ARGV + 1 then
  return refusal('INVALID', server_now, 0)
end
return replies
