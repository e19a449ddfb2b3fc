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
  encode_in_period = false, eval = false, same_period = false }

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

-- Whether two states have the same current window (`store` then leaves the key's expiry).
function SLIDING_COUNTER.same_period(a, b)
  return a.cw == b.cw
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

-- The fields a write in the held state's current window changes (`same_period`): nothing
-- rolled forward, so both window ids and the previous count stay.
function SLIDING_COUNTER.encode_in_period(st)
  return 'o', fmt(st.o), 'cc', fmt(st.cc)
end

-- Earliest offset into a window at which ceil(count * weight / SCALE) <= allowance, or nil
-- if no offset inside the window qualifies. Exact: weight <= floor(allowance * SCALE / count)
-- <=> (window - e) * SCALE <= w_max * window <=> e >= window - floor(w_max * window / SCALE).
local function earliest_offset(count, allowance, window)
  if count == 0 then return 0 end
  local w_max = divmod(allowance * SCALE, count)
  if w_max >= SCALE then return 0 end
  local offset = window - divmod(w_max * window, SCALE)
  if offset >= window then return nil end
  return offset
end

-- Time until `need` more units would be admitted, assuming no other traffic: later in this
-- window, in the next one (the current count becomes the previous), or at the start of the
-- one after (both empty). Never earlier than the true earliest millisecond. `w` holds the
-- evaluation's window, limit, counts and times (see `eval`). Functions at this level, not
-- inside `eval`: Lua builds a closure each time its definition runs, and only denials need it.
local function retry_for(need, w)
  if need > w.limit then
    return w.window_end + w.window - w.now
  end
  if w.cur_count + need <= w.limit then
    local offset = earliest_offset(w.weighted_count, w.limit - w.cur_count - need, w.window)
    if offset ~= nil and offset > w.elapsed then
      return offset - w.elapsed
    end
  end
  local offset = earliest_offset(w.cur_count, w.limit - need, w.window)
  if offset ~= nil then
    return w.window_end + offset - w.now
  end
  return w.window_end + w.window - w.now
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
  local estimate = cur_count
  if weighted_count > 0 then
    local weight = ceil_div((window - elapsed) * SCALE, window)
    estimate = estimate + ceil_div(weighted_count * weight, SCALE)
  end
  local window_end = (current + 1) * window

  local status, retry = 'DENIED', 0
  if c.cost == 0 then
    if estimate + 1 <= limit then
      status = 'ALLOWED'
    end
  elseif estimate <= limit and c.cost <= limit - estimate then
    -- cost may be up to 2^53 - 1: compared against the allowance instead of adding.
    cur_count = cur_count + c.cost
    estimate = estimate + c.cost
    status = 'ALLOWED'
  end
  if status == 'DENIED' then
    retry = retry_for(c.cost == 0 and 1 or c.cost, { limit = limit, window = window,
      now = now, elapsed = elapsed, window_end = window_end, cur_count = cur_count,
      weighted_count = weighted_count })
  end
  -- When the estimate reaches zero again (the full limit is available).
  local reset_at = now
  if cur_count > 0 then
    reset_at = window_end + window
  elseif weighted_count > 0 then
    reset_at = window_end
  end
  local reply = { status, server_now, now, limit, math.max(limit - estimate, 0), retry,
    reset_at }
  if c.cost == 0 then return reply end
  -- After the next window ends both counts have rolled out: the state equals an absent key.
  return reply, { o = now, pw = prev_id, pc = prev_count, cw = cur_id, cc = cur_count },
    window_end + window - now + c.grace
end
