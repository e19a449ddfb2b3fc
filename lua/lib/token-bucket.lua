-- Token bucket of `capacity` tokens refilled with `rate` tokens every `period` ms,
-- continuously: the sub-token part of a refill is carried as a remainder, so the level does
-- not depend on how often the bucket is evaluated. A full bucket accumulates nothing; an
-- absent key is a full bucket.
-- Stored fields: o last observed (= last refill) ms, t whole tokens, m sub-token remainder in
-- 1/period units (level = t + m / period; m = 0 whenever t = capacity).
-- More tokens than the capacity (the capacity was lowered) are clamped to a full bucket.
-- Every entry is named in the constructor (the functions below fill them in): a table grown
-- by assignment is rehashed each time it fills, and the program builds this one per call.
local TOKEN_BUCKET = { name = 'token_bucket', param_count = 3,
  params = false, limit = false, fields = false, decode = false, encode = false,
  encode_in_period = false, eval = false, same_period = false }

-- A table for the stored hash (prologue `load`), presized with every field it should hold.
function TOKEN_BUCKET.fields()
  return { v = false, a = false, p = false, r = false, o = false, t = false, m = false }
end

function TOKEN_BUCKET.params(period, rate, capacity)
  local p = {
    period = int_arg(period, 1, MAX_PERIOD),
    rate = int_arg(rate, 1, MAX),
    capacity = int_arg(capacity, 0, MAX),
  }
  if not p.period or not p.rate or not p.capacity then return nil, p.capacity or 0 end
  -- period * (rate + 1) <= MAX and capacity * period <= MAX, checked by division.
  local bound = divmod(MAX, p.period)
  if p.rate >= bound or p.capacity > bound then return nil, p.capacity end
  return p, p.capacity
end

function TOKEN_BUCKET.limit(p)
  return p.capacity
end

function TOKEN_BUCKET.decode(h, p)
  local st = { o = int_arg(h.o, 0, MAX), t = int_arg(h.t, 0, MAX), m = int_arg(h.m, 0, p.period - 1) }
  if not st.o or not st.t or not st.m then return nil end
  return st
end

function TOKEN_BUCKET.encode(st)
  return 'o', fmt(st.o), 't', fmt(st.t), 'm', fmt(st.m)
end

-- Milliseconds until a bucket of `tokens` and remainder `rem` holds `want` whole tokens:
-- ceil(((want - t) * period - m) / rate). At this level, not inside `eval`: Lua builds a
-- closure each time its definition runs.
local function time_to(want, tokens, rem, period, rate)
  if tokens >= want then return 0 end
  return ceil_div((want - tokens) * period - rem, rate)
end

function TOKEN_BUCKET.eval(p, c, st, now)
  local period, rate, capacity = p.period, p.rate, p.capacity
  local tokens, rem, last = capacity, 0, now
  if st then
    tokens, rem, last = st.t, st.m, st.o
    if tokens >= capacity then tokens, rem = capacity, 0 end
  end

  -- Refill over the elapsed time: q whole periods give q * rate tokens, the partial period
  -- r gives (r * rate + rem) / period more. Saturate before q * rate could leave the exact range.
  if tokens < capacity then
    local missing = capacity - tokens
    local q, r = divmod(now - last, period)
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

  local status, retry = 'DENIED', 0
  if c.cost == 0 then
    if tokens >= 1 then status = 'ALLOWED' end
  elseif tokens >= c.cost then
    tokens = tokens - c.cost
    status = 'ALLOWED'
  end
  local to_full = time_to(capacity, tokens, rem, period, rate)
  if status == 'DENIED' then
    -- A cost above capacity can never pass: point at the full bucket, at least one period away.
    local need = c.cost == 0 and 1 or c.cost
    if need > capacity then
      retry = math.max(to_full, period)
    else
      retry = time_to(need, tokens, rem, period, rate)
    end
  end
  -- reset_at = now + time to full, kept exact; only unreachable (~285,000 years away) saturates.
  local reset_at = MAX
  if to_full <= MAX - now then reset_at = now + to_full end
  local reply = { status, server_now, now, capacity, tokens, retry, reset_at }
  if c.cost == 0 then return reply end
  -- A full bucket equals an absent key. At least 1 ms so that the write is never a delete, and
  -- never past the exact range.
  local ttl = to_full
  if ttl > MAX - c.grace then ttl = MAX - c.grace end
  ttl = math.max(ttl + c.grace, 1)
  return reply, { o = now, t = tokens, m = rem }, ttl
end
