-- Every limit of one request decided together (the composite rule, see composite.lua), as a
-- function both drivers call: the composite program for one request, the batch program for
-- several requests in one call, each decided on its own and in order (a later request sees
-- what an earlier one stored).
--
-- kbase, nkeys  the request's keys are KEYS[kbase + 1 .. kbase + nkeys]
-- i             index in ARGV of the request's first check; n checks (framing as composite.lua)
-- late          the request's deadline has passed: nothing is read or stored, every check
--               answers EXPIRED
-- Returns the n replies and the index in ARGV after the request's checks.
-- Algorithms by their code, each module built the first time a check names it (the program
-- wraps each module in its loader, crates/redis/src/programs.rs). `false`: not built yet; an
-- unknown code (or none) finds nil.
local LOADERS = { f = FIXED_WINDOW_MODULE, s = SLIDING_COUNTER_MODULE, t = TOKEN_BUCKET_MODULE }
local algorithms = { f = false, s = false, t = false }
local function algorithm(code)
  local algo = algorithms[code]
  if algo == false then
    algo = LOADERS[code]()
    algorithms[code] = algo
  end
  return algo
end

-- The check whose arguments start at ARGV[i]: its algorithm, key index, shadow flag, common
-- arguments and parameters (any of them nil when malformed: the check answers INVALID), the
-- limit to report, and the index after its arguments.
local function parse_check(i, nkeys)
  local algo = algorithm(ARGV[i + 1])
  local count = algo and algo.param_count or 2
  local ki = int_arg(ARGV[i], 1, nkeys)
  local shadow = ARGV[i + 2] == '1'
  local c = common_args(ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7],
    ARGV[i + 8])
  local p, reported_limit = nil, 0
  if algo then
    p, reported_limit = algo.params(ARGV[i + 9], ARGV[i + 10], count == 3 and ARGV[i + 11] or nil)
  end
  local after = i + 9 + count
  if ARGV[after - 1] == nil then p = nil end
  return algo, ki, shadow, c, p, reported_limit, after
end

-- One check alone (most requests): the same rule without the bookkeeping of several checks
-- sharing keys. Admitted when ALLOWED (or shadow); stored only when ALLOWED and committing.
local function decide_one(kbase, nkeys, i, mode, late)
  local algo, ki, _, c, p, reported_limit, after = parse_check(i, nkeys)
  if not algo or not ki or not c or not p then
    return { refusal('INVALID', server_now, reported_limit) }, after
  end
  if late then
    return { refusal('EXPIRED', server_now, reported_limit) }, after
  end
  local key = KEYS[kbase + ki]
  local kind, st = load(key, algo, c, p)
  local reply, new_state, ttl = evaluate(algo, p, c, kind, st)
  if reply[1] == 'ALLOWED' and new_state then
    if mode == 'commit' then
      store(key, algo, c, new_state, ttl, kind, st)
    else
      -- Nothing is stored: report what the key holds now.
      local peek = { policy = c.policy, revision = c.revision, cost = 0,
        max_regression = c.max_regression, grace = c.grace }
      reply = evaluate(algo, p, peek, kind, st)
    end
  end
  return { reply }, after
end

local function decide_request(kbase, nkeys, i, n, mode, late)
  if n == 1 then return decide_one(kbase, nkeys, i, mode, late) end
  local held = {}     -- key index -> { kind, state } as stored before the request
  local working = {}  -- key index -> { kind, state } after the checks so far
  local pending = {}  -- key index -> { algorithm, common args, state, ttl } to store
  local checks = {}
  local replies = {}
  local admitted = true
  for k = 1, n do
    local algo, ki, shadow, c, p, reported_limit
    algo, ki, shadow, c, p, reported_limit, i = parse_check(i, nkeys)
    local reply
    if not algo or not ki or not c or not p then
      reply = refusal('INVALID', server_now, reported_limit)
    elseif late then
      reply = refusal('EXPIRED', server_now, reported_limit)
    else
      if not working[ki] then
        local kind, st = load(KEYS[kbase + ki], algo, c, p)
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

  if admitted and mode == 'commit' then
    for ki, w in pairs(pending) do
      store(KEYS[kbase + ki], w[1], w[2], w[3], w[4], held[ki][1], held[ki][2])
    end
    return replies, i
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
  return replies, i
end
