-- Fixed window of `window` ms aligned to the Unix epoch, `limit` units per window.
-- Stored fields: o last observed ms, w window id, c consumed.
-- A consumed count above the limit (the limit was lowered) is kept: nothing passes until the
-- window ends.
-- Every entry is named in the constructor (the functions below fill them in): a table grown
-- by assignment is rehashed each time it fills, and the program builds this one per call.
local FIXED_WINDOW = { name = 'fixed_window', param_count = 2,
  params = false, limit = false, fields = false, decode = false, encode = false,
  encode_in_period = false, eval = false, same_period = false }

-- A table for the stored hash (prologue `load`), presized with every field it should hold.
function FIXED_WINDOW.fields()
  return { v = false, a = false, p = false, r = false, o = false, w = false, c = false }
end

-- Parameters from ARGV strings; nil (and the limit to report) when malformed.
function FIXED_WINDOW.params(window, limit)
  local p = { window = int_arg(window, 1, MAX_PERIOD), limit = int_arg(limit, 0, MAX) }
  if not p.window or not p.limit then return nil, p.limit or 0 end
  return p, p.limit
end

function FIXED_WINDOW.limit(p)
  return p.limit
end

-- `h` is the stored hash, field by name (prologue `load`).
function FIXED_WINDOW.decode(h, _)
  local st = { o = int_arg(h.o, 0, MAX), w = int_arg(h.w, 0, MAX), c = int_arg(h.c, 0, MAX) }
  if not st.o or not st.w or not st.c then return nil end
  return st
end

-- Whether two states count the same window (`store` then leaves the key's expiry).
function FIXED_WINDOW.same_period(a, b)
  return a.w == b.w
end

function FIXED_WINDOW.encode(st)
  return 'o', fmt(st.o), 'w', fmt(st.w), 'c', fmt(st.c)
end

-- The fields a write in the held state's window changes (`same_period`): the window id stays.
function FIXED_WINDOW.encode_in_period(st)
  return 'o', fmt(st.o), 'c', fmt(st.c)
end

function FIXED_WINDOW.eval(p, c, st, now)
  local limit, window = p.limit, p.window
  local current = math.floor(now / window)
  local consumed = 0
  if st then
    if st.w > current then return refusal('STATE_INCOMPATIBLE', now, limit) end
    if st.w == current then consumed = st.c end
  end
  local reset_at = (current + 1) * window
  local remaining = 0
  if consumed < limit then remaining = limit - consumed end

  if c.cost == 0 then
    if consumed < limit then
      return { 'ALLOWED', server_now, now, limit, remaining, 0, reset_at }
    end
    return { 'DENIED', server_now, now, limit, remaining, reset_at - now, reset_at }
  end

  local status = 'DENIED'
  local retry = reset_at - now
  if consumed <= limit and c.cost <= limit - consumed then
    consumed = consumed + c.cost
    remaining = limit - consumed
    status = 'ALLOWED'
    retry = 0
  end
  return { status, server_now, now, limit, remaining, retry, reset_at },
    { o = now, w = current, c = consumed }, reset_at - now + c.grace
end
