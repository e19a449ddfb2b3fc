-- Sliding-window counter: `limit` units per rolling `window` ms, estimated from the previous
-- and the current epoch-aligned window. The previous window's count is weighted by the part of
-- it still inside the rolling window, rounded up (parts per million), so the estimate never
-- under-counts; the result is approximate, never lenient.
-- Stored fields: o last observed ms, pw pc previous window id/count, cw cc current.
-- Counts above the limit (the limit was lowered) are kept and weighted like any other.
local SCALE = 1000000
-- window * SCALE and count * SCALE must stay exact: floor(MAX / SCALE).
local MAX_SCALED = 9007199254
-- Every entry is named in the constructor (the functions below fill them in): a table grown
-- by assignment is rehashed each time it fills, and the program builds this one per call.
local SLIDING_COUNTER = { name = 'sliding_window', param_count = 2,
  params = false, limit = false, fields = false, decode = false, encode = false,
  eval = false }

-- A table for the stored hash (prologue `load`), presized with every field it should hold.
function SLIDING_COUNTER.fields()
  return { v = false, a = false, p = false, r = false, o = false, pw = false, pc = false,
    cw = false, cc = false }
end

function SLIDING_COUNTER.params(window, limit)
  local p = { window = int_arg(window, 1, MAX_SCALED), limit = int_arg(limit, 0, MAX_SCALED) }
  if not p.window or not p.limit then return nil, p.limit or 0 end
  return p, p.limit
end

function SLIDING_COUNTER.limit(p)
  return p.limit
end

function SLIDING_COUNTER.decode(h, _)
  local st = {
    o = int_arg(h.o, 0, MAX),
    pw = int_arg(h.pw, 0, MAX),
    pc = int_arg(h.pc, 0, MAX_SCALED),
    cw = int_arg(h.cw, 0, MAX),
    cc = int_arg(h.cc, 0, MAX_SCALED),
  }
  if not st.o or not st.pw or not st.pc or not st.cw or not st.cc then return nil end
  return st
end

function SLIDING_COUNTER.encode(st)
  return 'o', fmt(st.o), 'pw', fmt(st.pw), 'pc', fmt(st.pc), 'cw', fmt(st.cw), 'cc', fmt(st.cc)
end

function SLIDING_COUNTER.eval(p, c, st, now)
  local window, limit = p.window, p.limit
  local prev_id, prev_count, cur_id, cur_count = nil, 0, nil, 0
  if st then prev_id, prev_count, cur_id, cur_count = st.pw, st.pc, st.cw, st.cc end

  local current, elapsed = divmod(now, window)
  if cur_id ~= nil and cur_id > current then
    return refusal('STATE_INCOMPATIBLE', now, limit)
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
  -- (window - elapsed) * SCALE <= window * SCALE and count * weight <= MAX_SCALED * SCALE.
  local function weighted(count, into_window)
    if count == 0 then return 0 end
    local weight = ceil_div((window - into_window) * SCALE, window)
    return ceil_div(count * weight, SCALE)
  end

  -- Earliest offset into a window at which ceil(count * weight / SCALE) <= allowance, or nil
  -- if no offset inside the window qualifies. Exact: weight <= floor(allowance * SCALE / count)
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
      return window_end + window - now
    end
    if cur_count + need <= limit then
      local offset = earliest_offset(weighted_count, limit - cur_count - need)
      if offset ~= nil and offset > elapsed then
        return offset - elapsed
      end
    end
    local offset = earliest_offset(cur_count, limit - need)
    if offset ~= nil then
      return window_end + offset - now
    end
    return window_end + window - now
  end

  -- When the estimate reaches zero again (the full limit is available).
  local function reset_at_for(count_now)
    if count_now > 0 then return window_end + window end
    if weighted_count > 0 then return window_end end
    return now
  end

  if c.cost == 0 then
    if estimate + 1 <= limit then
      return { 'ALLOWED', server_now, now, limit, limit - estimate, 0, reset_at_for(cur_count) }
    end
    return { 'DENIED', server_now, now, limit, math.max(limit - estimate, 0), retry_for(1),
      reset_at_for(cur_count) }
  end

  local status = 'DENIED'
  local retry = 0
  -- cost may be up to 2^53 - 1: compare against the allowance instead of adding.
  if estimate <= limit and c.cost <= limit - estimate then
    cur_count = cur_count + c.cost
    estimate = estimate + c.cost
    status = 'ALLOWED'
  else
    retry = retry_for(c.cost)
  end
  -- After the next window ends both counts have rolled out: the state equals an absent key.
  return { status, server_now, now, limit, math.max(limit - estimate, 0), retry,
      reset_at_for(cur_count) },
    { o = now, pw = prev_id, pc = prev_count, cw = cur_id, cc = cur_count },
    window_end + window - now + c.grace
end
