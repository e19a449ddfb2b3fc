-- Shared prologue, composed at build time into every program (crates/redis/src/programs.rs):
-- the clock, the integer helpers, argument and state checks, and the single evaluation the
-- Rust mirror `algorithm::evaluate` implements. Every number stays below 2^53 - 1 (Lua numbers
-- are doubles); callers validate ranges too.
local MAX = 9007199254740991
local SCHEMA = '1'
-- Bound of the clock-regression and cleanup-grace arguments (one day).
local MAX_SAFETY = 86400000
-- Longest window or refill period (400 days): every timestamp sum stays exact.
local MAX_PERIOD = 34560000000

-- TIME exactly once per call: every evaluation of the call sees the same server time.
local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Decimal digits only: rejects '1e3', '0x10', ' 5', '-0' and anything past 2^53 - 1.
-- `v + 0` converts once (tonumber twice). Numbers written to state are formatted as integers
-- (tostring would use %.14g).
--
-- With MEMOISE (the program's first line: the batch and composite programs) each distinct
-- string is checked and converted, and each number formatted, once per call: a batch repeats
-- the same policy arguments, window ids and timestamps for many members. A single-key program
-- sees each about once, and there the memo (tables rehashed as they fill, a lookup per use) cost
-- more than it saved: 11k of its 175k instructions. Hence two definitions, not one with a test.
local find, format = string.find, string.format
local int_arg, fmt
if MEMOISE then
  local parsed, formatted = {}, {}
  int_arg = function(v, lo, hi)
    if type(v) ~= 'string' then return nil end
    local n = parsed[v]
    if n == nil then
      n = #v > 0 and #v <= 16 and find(v, '^%d+$') ~= nil and v + 0
      parsed[v] = n
    end
    if not n or n < lo or n > hi then return nil end
    return n
  end
  fmt = function(n)
    local s = formatted[n]
    if not s then
      s = format('%d', n)
      formatted[n] = s
    end
    return s
  end
else
  int_arg = function(v, lo, hi)
    if type(v) ~= 'string' then return nil end
    local n = #v > 0 and #v <= 16 and find(v, '^%d+$') ~= nil and v + 0
    if not n or n < lo or n > hi then return nil end
    return n
  end
  fmt = function(n)
    return format('%d', n)
  end
end

-- Exact integer quotient and remainder of 0 <= n <= 2^53 - 1 by d >= 1 (fmod is exact).
local function divmod(n, d)
  local r = math.fmod(n, d)
  return (n - r) / d, r
end

-- ceil(n / d) without an n + d - 1 intermediate.
local function ceil_div(n, d)
  local q, r = divmod(n, d)
  if r > 0 then q = q + 1 end
  return q
end

-- Whether the caller's deadline (Unix ms on this server's clock; '' or absent: none) has
-- passed: a program that starts after it does nothing, its caller has answered without it.
-- nil when malformed.
local function past(deadline)
  if deadline == nil or deadline == '' then return false end
  local d = int_arg(deadline, 0, MAX)
  if not d then return nil end
  return server_now > d
end

-- A reply that is not a decision: the last three numbers are 0.
local function refusal(status, effective_now, limit)
  return { status, server_now, effective_now, limit, 0, 0, 0 }
end

-- The arguments every evaluation takes: schema, policy id, policy revision, cost (0 = peek),
-- max clock regression ms, cleanup grace ms. nil when any is malformed.
local function common_args(schema, policy, revision, cost, max_regression, grace)
  local c = {
    policy = policy,
    revision = revision,
    cost = int_arg(cost, 0, MAX),
    max_regression = int_arg(max_regression, 0, MAX_SAFETY),
    grace = int_arg(grace, 0, MAX_SAFETY),
  }
  if schema ~= SCHEMA or not policy or policy == '' or not revision or revision == ''
    or not c.cost or not c.max_regression or not c.grace then
    return nil
  end
  return c
end

-- What `key` holds for this algorithm and policy: 'absent', 'present' with the decoded state,
-- or 'incompatible' (another type, schema, algorithm, policy or revision, a malformed field).
-- One HGETALL whatever the key holds: empty for an absent key, WRONGTYPE (caught) for another
-- type, and the hash's few fields otherwise — a new subject costs no second call to tell an
-- absent key from a hash of someone else's fields.
local function load(key, algo, c, p)
  local all = redis.pcall('HGETALL', key)
  if all.err then return 'incompatible' end
  if #all == 0 then return 'absent' end
  -- Presized with every field the algorithm stores: a table grown by assignment is rehashed
  -- each time it fills (1, 2, 4, 8 slots), about 2k instructions per call for a 7-field hash.
  local h = algo.fields()
  for i = 1, #all, 2 do h[all[i]] = all[i + 1] end
  if h.v ~= SCHEMA or h.a ~= algo.name or h.p ~= c.policy or h.r ~= c.revision then
    return 'incompatible'
  end
  local st = algo.decode(h, p)
  if not st then return 'incompatible' end
  return 'present', st
end

-- One evaluation on a loaded state: the reply, and the state to store with its TTL (nil for a
-- peek or a refusal). A small backward clock step is clamped to the stored last observation;
-- a larger one is CLOCK_UNSAFE.
local function evaluate(algo, p, c, kind, st)
  if kind == 'incompatible' then
    return refusal('STATE_INCOMPATIBLE', server_now, algo.limit(p))
  end
  local now = server_now
  if kind == 'present' then
    if server_now < st.o then
      if st.o - server_now > c.max_regression then
        return refusal('CLOCK_UNSAFE', server_now, algo.limit(p))
      end
      now = st.o
    end
  else
    st = nil
  end
  return algo.eval(p, c, st, now)
end

-- `kind` and `held` are what `load` found: over a present state of this policy the header
-- already holds these values, and only the algorithm's fields are written (half of HSET's
-- arguments); in the held state's window only those the write changes (`encode_in_period`).
-- The algorithm's `encode` returns the field-value pairs as values, not a table: the last
-- argument of a call expands to all of them, with no table to build and unpack.
--
-- A window's expiry is a function of the window alone (its end plus the grace), so a write in
-- the held state's window leaves the expiry its first write set: one PEXPIRE per subject and
-- window, not per decision. That first write, if clamped, set it up to the clamp earlier; with
-- a grace below the regression bound the key could then end before its window, so the expiry
-- is refreshed on every write. The Rust mirror is `algorithm::Write::keeps_expiry`.
local function store(key, algo, c, st, ttl, kind, held)
  if kind ~= 'present' then
    redis.call('HSET', key, 'v', SCHEMA, 'a', algo.name, 'p', c.policy, 'r', c.revision,
      algo.encode(st))
  elseif algo.same_period and algo.same_period(held, st) then
    redis.call('HSET', key, algo.encode_in_period(st))
    if c.grace >= c.max_regression then return end
  else
    redis.call('HSET', key, algo.encode(st))
  end
  redis.call('PEXPIRE', key, fmt(ttl))
end
