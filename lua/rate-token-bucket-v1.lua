-- edgelimit rate-token-bucket-v1
-- Token bucket of ARGV[9] tokens refilled with ARGV[8] tokens every ARGV[7] ms, continuously:
-- the sub-token part of a refill is carried as a remainder, so the level does not depend on
-- how often the bucket is evaluated. A full bucket accumulates nothing.
--
-- KEYS[1]  state hash (one key per policy revision and subject)
-- ARGV[1]  schema version ("1")      ARGV[2] policy id       ARGV[3] policy revision (hex)
-- ARGV[4]  cost (0 = peek: report, change nothing)
-- ARGV[5]  max clock regression ms   ARGV[6] cleanup grace ms
-- ARGV[7]  refill period ms          ARGV[8] refill tokens   ARGV[9] capacity
--
-- Stored fields: v a p r, o last observed (= last refill) ms, t whole tokens, m sub-token
-- remainder in 1/period units (level = t + m / period; m = 0 whenever t = capacity).
-- An absent key is a full bucket.
--
-- Reply: { status, serverNowMillis, effectiveNowMillis, limit (= capacity), remaining (whole
--          tokens), retryAfterMillis, resetAtMillis }, status one of ALLOWED DENIED
--          CLOCK_UNSAFE STATE_INCOMPATIBLE INVALID.
-- Every number stays below 2^53 - 1 (Lua numbers are doubles); callers validate ranges too.
local MAX = 9007199254740991
local ALGORITHM = 'token_bucket'

local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Decimal digits only: rejects '1e3', '0x10', ' 5', '-0' and anything past 2^53 - 1.
local function int_arg(v, lo, hi)
  if type(v) ~= 'string' or #v == 0 or #v > 16 or not string.match(v, '^%d+$') then return nil end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

-- Numbers written to state are formatted as integers; tostring would use %.14g.
local function fmt(n)
  return string.format('%d', n)
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

local schema = ARGV[1]
local policy = ARGV[2]
local revision = ARGV[3]
local cost = int_arg(ARGV[4], 0, MAX)
local max_regression = int_arg(ARGV[5], 0, 86400000)
local grace = int_arg(ARGV[6], 0, 86400000)
local period = int_arg(ARGV[7], 1, 34560000000)
local rate = int_arg(ARGV[8], 1, MAX)
local capacity = int_arg(ARGV[9], 0, MAX)
-- period * (rate + 1) <= MAX and capacity * period <= MAX, checked by division.
local bound = period and divmod(MAX, period)
if schema ~= '1' or not policy or policy == '' or not revision or revision == ''
  or not cost or not max_regression or not grace or not period or not rate or not capacity
  or rate >= bound or capacity > bound then
  return { 'INVALID', server_now, server_now, capacity or 0, 0, 0, 0 }
end

local key = KEYS[1]
local key_type = redis.call('TYPE', key)
key_type = key_type.ok or key_type
if key_type ~= 'hash' and key_type ~= 'none' then
  return { 'STATE_INCOMPATIBLE', server_now, server_now, capacity, 0, 0, 0 }
end

local tokens = capacity
local rem = 0
local last = server_now
local effective_now = server_now
if key_type == 'hash' then
  local s = redis.call('HMGET', key, 'v', 'a', 'p', 'r', 'o', 't', 'm')
  last = int_arg(s[5], 0, MAX)
  tokens = int_arg(s[6], 0, capacity)
  rem = int_arg(s[7], 0, period - 1)
  if s[1] ~= schema or s[2] ~= ALGORITHM or s[3] ~= policy or s[4] ~= revision
    or not last or not tokens or not rem or (tokens == capacity and rem ~= 0) then
    return { 'STATE_INCOMPATIBLE', server_now, server_now, capacity, 0, 0, 0 }
  end
  if server_now < last then
    if last - server_now > max_regression then
      return { 'CLOCK_UNSAFE', server_now, server_now, capacity, 0, 0, 0 }
    end
    effective_now = last
  end
end

-- Refill over the elapsed time: q whole periods give q * rate tokens, the partial period
-- r gives (r * rate + rem) / period more. Saturate before q * rate could leave the exact range.
if tokens < capacity then
  local missing = capacity - tokens
  local q, r = divmod(effective_now - last, period)
  if q >= ceil_div(missing, rate) then
    tokens, rem = capacity, 0
  else
    -- q * rate < missing; r * rate + rem < period * (rate + 1) <= MAX
    local whole, carry = divmod(r * rate + rem, period)
    if whole >= missing - q * rate then
      tokens, rem = capacity, 0
    else
      tokens, rem = tokens + q * rate + whole, carry
    end
  end
end

-- Milliseconds until the bucket holds `want` whole tokens: ceil((want - t) * period - m) / rate).
local function time_to(want)
  if tokens >= want then return 0 end
  return ceil_div((want - tokens) * period - rem, rate)
end

local time_to_full = time_to(capacity)
-- reset_at = now + time to full, kept exact; only unreachable (~285,000 years away) saturates.
local function reset_at()
  local ttf = time_to(capacity)
  if ttf > MAX - effective_now then return MAX end
  return effective_now + ttf
end

-- A cost above capacity can never pass: point at the full bucket, at least one period away.
local function retry_for(need)
  if need > capacity then return math.max(time_to_full, period) end
  return time_to(need)
end

if cost == 0 then
  if tokens >= 1 then
    return { 'ALLOWED', server_now, effective_now, capacity, tokens, 0, reset_at() }
  end
  return { 'DENIED', server_now, effective_now, capacity, tokens, retry_for(1), reset_at() }
end

local status = 'DENIED'
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  status = 'ALLOWED'
else
  retry = retry_for(cost)
end
redis.call('HSET', key, 'v', schema, 'a', ALGORITHM, 'p', policy, 'r', revision,
  'o', fmt(effective_now), 't', fmt(tokens), 'm', fmt(rem))
-- A full bucket equals an absent key. At least 1 ms so that the write is never a delete, and
-- never past the exact range.
local ttl = time_to(capacity)
if ttl > MAX - grace then ttl = MAX - grace end
ttl = math.max(ttl + grace, 1)
redis.call('PEXPIRE', key, fmt(ttl))
return { status, server_now, effective_now, capacity, tokens, retry, reset_at() }
