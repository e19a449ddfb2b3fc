-- edgelimit rate-sliding-counter-v1
-- Sliding-window counter: ARGV[8] units per rolling ARGV[7] ms, estimated from the previous
-- and the current epoch-aligned window. The previous window's count is weighted by the part of
-- it still inside the rolling window, rounded up (parts per million), so the estimate never
-- under-counts; the result is approximate, never lenient.
--
-- KEYS[1]  state hash (one key per policy revision and subject)
-- ARGV[1]  schema version ("1")      ARGV[2] policy id       ARGV[3] policy revision (hex)
-- ARGV[4]  cost (0 = peek: report, change nothing)
-- ARGV[5]  max clock regression ms   ARGV[6] cleanup grace ms
-- ARGV[7]  window ms                 ARGV[8] limit
--
-- Stored fields: v a p r, o last observed ms, pw pc previous window id/count, cw cc current.
--
-- Reply: { status, serverNowMillis, effectiveNowMillis, limit, remaining, retryAfterMillis,
--          resetAtMillis }, status one of ALLOWED DENIED CLOCK_UNSAFE STATE_INCOMPATIBLE INVALID.
-- Every number stays below 2^53 - 1 (Lua numbers are doubles); callers validate ranges too.
local MAX = 9007199254740991
local SCALE = 1000000
-- window * SCALE and limit * SCALE must stay exact: floor(MAX / SCALE).
local MAX_SCALED = 9007199254
local ALGORITHM = 'sliding_window'

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
local window = int_arg(ARGV[7], 1, MAX_SCALED)
local limit = int_arg(ARGV[8], 0, MAX_SCALED)
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

local prev_id, prev_count, cur_id, cur_count = nil, 0, nil, 0
local effective_now = server_now
if key_type == 'hash' then
  local s = redis.call('HMGET', key, 'v', 'a', 'p', 'r', 'o', 'pw', 'pc', 'cw', 'cc')
  local last = int_arg(s[5], 0, MAX)
  prev_id = int_arg(s[6], 0, MAX)
  prev_count = int_arg(s[7], 0, limit)
  cur_id = int_arg(s[8], 0, MAX)
  cur_count = int_arg(s[9], 0, limit)
  if s[1] ~= schema or s[2] ~= ALGORITHM or s[3] ~= policy or s[4] ~= revision
    or not last or not prev_id or not prev_count or not cur_id or not cur_count then
    return { 'STATE_INCOMPATIBLE', server_now, server_now, limit, 0, 0, 0 }
  end
  if server_now < last then
    if last - server_now > max_regression then
      return { 'CLOCK_UNSAFE', server_now, server_now, limit, 0, 0, 0 }
    end
    effective_now = last
  end
end

local current, elapsed = divmod(effective_now, window)
if cur_id ~= nil and cur_id > current then
  return { 'STATE_INCOMPATIBLE', server_now, effective_now, limit, 0, 0, 0 }
end
-- Roll forward. A previous window that is not adjacent to the current one counts as empty.
if cur_id == nil then
  prev_id, prev_count, cur_id, cur_count = math.max(current - 1, 0), 0, current, 0
elseif cur_id < current then
  if cur_id + 1 == current then
    prev_id, prev_count = cur_id, cur_count
  else
    prev_id, prev_count = current - 1, 0
  end
  cur_id, cur_count = current, 0
end
local weighted_count = 0
if prev_id + 1 == current then weighted_count = prev_count end

-- Weighted previous count: ceil(count * ceil((window - elapsed) * SCALE / window) / SCALE).
-- (window - elapsed) * SCALE <= window * SCALE and count * weight <= limit * SCALE stay exact.
local function weighted(count, into_window)
  if count == 0 then return 0 end
  local weight = ceil_div((window - into_window) * SCALE, window)
  return ceil_div(count * weight, SCALE)
end

-- Earliest offset into a window at which ceil(count * weight / SCALE) <= allowance, or nil if
-- no offset inside the window qualifies. Exact: weight <= floor(allowance * SCALE / count)
-- <=> (window - e) * SCALE <= w_max * window <=> e >= window - floor(w_max * window / SCALE).
local function earliest_offset(count, allowance)
  if count == 0 then return 0 end
  local w_max = divmod(allowance * SCALE, count)
  if w_max >= SCALE then return 0 end
  local offset = window - divmod(w_max * window, SCALE)
  if offset >= window then return nil end
  return offset
end

local estimate = weighted(weighted_count, elapsed) + cur_count
local window_end = (current + 1) * window

-- Time until `need` more units would be admitted, assuming no other traffic: later in this
-- window, in the next one (the current count becomes the previous), or at the start of the
-- one after (both empty). Never earlier than the true earliest millisecond.
local function retry_for(need)
  if need > limit then
    return window_end + window - effective_now
  end
  if cur_count + need <= limit then
    local offset = earliest_offset(weighted_count, limit - cur_count - need)
    if offset ~= nil and offset > elapsed then
      return offset - elapsed
    end
  end
  local offset = earliest_offset(cur_count, limit - need)
  if offset ~= nil then
    return window_end + offset - effective_now
  end
  return window_end + window - effective_now
end

-- When the estimate reaches zero again (the full limit is available).
local function reset_at_for(count_now)
  if count_now > 0 then return window_end + window end
  if weighted_count > 0 then return window_end end
  return effective_now
end

if cost == 0 then
  if estimate + 1 <= limit then
    return { 'ALLOWED', server_now, effective_now, limit, limit - estimate, 0,
      reset_at_for(cur_count) }
  end
  return { 'DENIED', server_now, effective_now, limit, math.max(limit - estimate, 0), retry_for(1),
    reset_at_for(cur_count) }
end

local status = 'DENIED'
local retry = 0
-- cost may be up to 2^53 - 1: compare against the allowance instead of adding.
if estimate <= limit and cost <= limit - estimate then
  cur_count = cur_count + cost
  estimate = estimate + cost
  status = 'ALLOWED'
else
  retry = retry_for(cost)
end
redis.call('HSET', key, 'v', schema, 'a', ALGORITHM, 'p', policy, 'r', revision,
  'o', fmt(effective_now), 'pw', fmt(prev_id), 'pc', fmt(prev_count), 'cw', fmt(cur_id),
  'cc', fmt(cur_count))
-- After the next window ends both counts have rolled out: the state equals an absent key.
redis.call('PEXPIRE', key, fmt(window_end + window - effective_now + grace))
return { status, server_now, effective_now, limit, math.max(limit - estimate, 0), retry,
  reset_at_for(cur_count) }
