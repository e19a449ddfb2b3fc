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
local ALGORITHMS = { f = FIXED_WINDOW, s = SLIDING_COUNTER, t = TOKEN_BUCKET }

local n = int_arg(ARGV[3], 1, 1024)
local mode = ARGV[2]
local late = past(ARGV[4])
if ARGV[1] ~= '1' or not n or (mode ~= 'commit' and mode ~= 'check') or late == nil then
  return refusal('INVALID', server_now, 0)
end
if late then
  local expired = {}
  for k = 1, n do expired[k] = refusal('EXPIRED', server_now, 0) end
  return expired
end

local held = {}     -- key index -> { kind, state } as stored before the request
local working = {}  -- key index -> { kind, state } after the checks so far
local pending = {}  -- key index -> { algorithm, common args, state, ttl } to store
local checks = {}
local replies = {}
local admitted = true
local i = 5
for k = 1, n do
  local letter = ARGV[i + 1]
  local algo = ALGORITHMS[letter]
  local count = algo and algo.param_count or 2
  local ki = int_arg(ARGV[i], 1, #KEYS)
  local shadow = ARGV[i + 2] == '1'
  local c = common_args(ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7],
    ARGV[i + 8])
  local p, reported_limit = nil, 0
  if algo then
    p, reported_limit = algo.params(ARGV[i + 9], ARGV[i + 10], count == 3 and ARGV[i + 11] or nil)
  end
  i = i + 9 + count
  local reply
  if not algo or not ki or not c or not p or (ARGV[i - 1] == nil) then
    reply = refusal('INVALID', server_now, reported_limit)
  else
    if not working[ki] then
      local kind, st = load(KEYS[ki], algo, c, p)
      held[ki] = { kind, st }
      working[ki] = held[ki]
    end
    local new_state, ttl
    reply, new_state, ttl = evaluate(algo, p, c, working[ki][1], working[ki][2])
    if reply[1] == 'ALLOWED' and new_state then
      working[ki] = { 'present', new_state }
      pending[ki] = { algo, c, new_state, ttl }
    end
    checks[k] = { ki = ki, algo = algo, p = p, c = c }
  end
  replies[k] = reply
  if reply[1] ~= 'ALLOWED' and not shadow then admitted = false end
end
if i ~= #ARGV + 1 then
  return refusal('INVALID', server_now, 0)
end

if admitted and mode == 'commit' then
  for ki, w in pairs(pending) do
    store(KEYS[ki], w[1], w[2], w[3], w[4])
  end
  return replies
end

-- Nothing is stored: what an admitting check reports is what its key holds now.
for k = 1, n do
  local check = checks[k]
  if check and replies[k][1] == 'ALLOWED' then
    local peek = { policy = check.c.policy, revision = check.c.revision, cost = 0,
      max_regression = check.c.max_regression, grace = check.c.grace }
    local h = held[check.ki]
    replies[k] = evaluate(check.algo, check.p, peek, h[1], h[2])
  end
end
return replies
