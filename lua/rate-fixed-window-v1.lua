-- edgelimit rate-fixed-window-v1
-- Fixed window of ARGV[7] ms aligned to the Unix epoch, ARGV[8] units per window.
--
-- KEYS[1]  state hash (one key per policy revision and subject)
-- ARGV[1]  schema version ("1")      ARGV[2] policy id       ARGV[3] policy revision (hex)
-- ARGV[4]  cost (0 = peek: report, change nothing)
-- ARGV[5]  max clock regression ms   ARGV[6] cleanup grace ms
-- ARGV[7]  window ms                 ARGV[8] limit
--
-- Reply: { status, serverNowMillis, effectiveNowMillis, limit, remaining, retryAfterMillis,
--          resetAtMillis }, status one of ALLOWED DENIED CLOCK_UNSAFE STATE_INCOMPATIBLE INVALID.
-- Every number stays below 2^53 - 1 (Lua numbers are doubles); callers validate ranges too.
local MAX = 9007199254740991
local ALGORITHM = 'fixed_window'

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

local schema = ARGV[1]
local policy = ARGV[2]
local revision = ARGV[3]
local cost = int_arg(ARGV[4], 0, MAX)
local max_regression = int_arg(ARGV[5], 0, 86400000)
local grace = int_arg(ARGV[6], 0, 86400000)
local window = int_arg(ARGV[7], 1, 34560000000)
local limit = int_arg(ARGV[8], 0, MAX)
if schema ~= '1' or not policy or policy == '' or not revision or revision == ''
  or not cost or not max_regression or not grace or not window or not limit then
  return { 'INVALID', server_now, server_now, limit or 0, 0, 0, 0 }
end

local key = KEYS[1]
local key_type = redis.call('TYPE', key)
key_type = key_type.ok or key_type
if key_type ~= 'hash' and key_type ~= 'none' then
  return { 'STATE_INCOMPATIBLE', server_now, server_now, limit, 0, 0, 0 }
end

local window_id = nil
local consumed = 0
local effective_now = server_now
if key_type == 'hash' then
  local s = redis.call('HMGET', key, 'v', 'a', 'p', 'r', 'o', 'w', 'c')
  local last = int_arg(s[5], 0, MAX)
  local stored_window = int_arg(s[6], 0, MAX)
  local stored_consumed = int_arg(s[7], 0, limit)
  if s[1] ~= schema or s[2] ~= ALGORITHM or s[3] ~= policy or s[4] ~= revision
    or not last or not stored_window or not stored_consumed then
    return { 'STATE_INCOMPATIBLE', server_now, server_now, limit, 0, 0, 0 }
  end
  if server_now < last then
    if last - server_now > max_regression then
      return { 'CLOCK_UNSAFE', server_now, server_now, limit, 0, 0, 0 }
    end
    effective_now = last
  end
  window_id = stored_window
  consumed = stored_consumed
end

local current = math.floor(effective_now / window)
if window_id ~= nil and window_id > current then
  return { 'STATE_INCOMPATIBLE', server_now, effective_now, limit, 0, 0, 0 }
end
if window_id ~= current then
  consumed = 0
end
local reset_at = (current + 1) * window

if cost == 0 then
  local status = 'DENIED'
  local retry = reset_at - effective_now
  if consumed < limit then
    status = 'ALLOWED'
    retry = 0
  end
  return { status, server_now, effective_now, limit, limit - consumed, retry, reset_at }
end

local status = 'DENIED'
local retry = reset_at - effective_now
if consumed + cost <= limit then
  consumed = consumed + cost
  status = 'ALLOWED'
  retry = 0
end
redis.call('HSET', key, 'v', schema, 'a', ALGORITHM, 'p', policy, 'r', revision,
  'o', fmt(effective_now), 'w', fmt(current), 'c', fmt(consumed))
redis.call('PEXPIRE', key, fmt(reset_at - effective_now + grace))
return { status, server_now, effective_now, limit, limit - consumed, retry, reset_at }
