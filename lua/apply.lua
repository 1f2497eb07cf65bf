--[[
floodgate — lua/apply.lua: apply every bucket operation of one rate-limit request atomically.

It computes exactly what `limiter::evaluate` followed by `bucket::settle` compute in Rust
(src/limiter/ is the specification; docs/algorithms.md explains the math): phase 1 reads every
bucket and evaluates every operation against the state as it was before the call; phase 2
writes the new state of every admitted operation (and of every overdraft debit, admitted or
not) if every enforcing, non-overdraft operation was admitted, and writes nothing otherwise
(DESIGN §4: a denied request debits nothing).

KEYS[i]  full Redis key of operation i (configured prefix + BucketKey bytes).

ARGV[1]  "now" in µs since the Unix epoch as a decimal integer, or "" to use Redis TIME
         (sec * 1000000 + usec). The override exists so tests can fix time; production passes "".
ARGV[2 + 7*(i-1) .. 8 + 7*(i-1)], seven values per operation i, all decimal integers:
         algorithm            0 token_bucket, 1 fixed_window, 2 sliding_window
         requests_per_period  >= 0
         period_us            >= 0
         burst                >= 0 (token bucket capacity; ignored by the windows)
         cost                 signed: > 0 debit, 0 check only, < 0 refund
         enforce              1 enforcing, 0 shadow (evaluated, never blocks the request)
         overdraft            1 overdraft (a debit always applies, into debt beyond the
                              capacity; never blocks the request), 0 all-or-nothing

Reply    a flat array of integers, 1 + 4 * #KEYS long:
         committed (0/1), then per operation: admitted (0/1), remaining, reset_us,
         retry_after_us (-1 = never). As `bucket::settle`: the view is the committed one when
         committed and (admitted or overdraft), else the current one; retry_after_us is 0 when
         admitted (for an overdraft debit that did not fit: until the debited bucket is no
         longer overdrawn).
         A malformed call (argument count, a non-integer, unknown algorithm) is an error reply
         starting "ERR floodgate".

Storage  token bucket: a string, the theoretical arrival time in µs (SET key tat PX ttl).
         fixed window: a hash {w = window index, c = count}.
         sliding window: a hash {w = window index, c = current count, p = previous count}.
         Every write sets a TTL of ceil(ttl_us / 1000) ms — rounded up, so a key never expires
         before its state is equivalent to absent; a ttl_us of 0 deletes the key instead.
         A key holding another type, another algorithm's shape (a fixed window hash with a `p`
         field, a sliding one without), or anything that does not parse as the integers above
         is treated as absent, like the Rust treats implausible state; a write replaces it.

Numbers  Lua 5.1 computes in doubles, so every value stays below 2^53 (the Rust bounds:
         now clamped to [0, 2^52], period to [1 ms, 2^36 ms], counts to 2^32 - 1, token bucket
         debt to 2^50) and only +, -, * and floor division of non-negative integers are used
         (`fdiv`, which corrects the quotient). Values are written with string.format('%d').

The same key twice in one call (the planner sums costs per bucket, so it should not happen):
every operation is evaluated against the state before the call and the later operation's
write wins — exactly what the memory store does.
]]

local MAX_NOW = 4503599627370496 -- 2^52 µs, limiter::MAX_NOW_US
local MAX_PERIOD = 68719476736000 -- 2^36 ms in µs, limiter::MAX_PERIOD_US
local MAX_TOLERANCE = 1125899906842624 -- 2^50 µs, limiter::MAX_TOLERANCE_US
local MAX_COUNT = 4294967295 -- u32::MAX, limiter::MAX_COUNT
local ONE = 65536 -- fixed-point one of the sliding window's weight
local ARGS_PER_OP = 7

-- Scripts that call TIME and then write must be replicated by effects (the default since
-- Redis 5, and the only mode since 7); ask for it on older servers.
if redis.replicate_commands then
  redis.replicate_commands()
end

-- floor(a / b) for integers 0 <= a, 0 < b, both below 2^53: the double quotient may round to
-- a neighbour, so correct it until q * b <= a < (q + 1) * b (limiter::window::floor_div).
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  end
  if (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers 0 <= a, 0 < b (u64::div_ceil).
local function cdiv(a, b)
  return fdiv(a + b - 1, b)
end

local function clamp(x, lo, hi)
  if x < lo then
    return lo
  elseif x > hi then
    return hi
  end
  return x
end

-- A decimal integer (optionally negative), or nil for anything else (false, floats, junk).
local function parse_int(s)
  if type(s) == 'string' and string.find(s, '^%-?%d+$') then
    return tonumber(s)
  end
  return nil
end

-- A non-negative decimal integer, or nil.
local function parse_uint(s)
  if type(s) == 'string' and string.find(s, '^%d+$') then
    return tonumber(s)
  end
  return nil
end

-- The shapes of limiter::Evaluation. A view is {remaining, reset_us}; retry nil = never.
local function unchanged(view)
  return { admitted = true, committed = view, current = view, retry = 0 }
end

local function denied(view, retry)
  return { admitted = false, committed = view, current = view, retry = retry }
end

local function commit(current, next, committed)
  return { admitted = true, next = next, committed = committed, current = current, retry = 0 }
end

-- An overdraft debit that did not fit: not admitted, but its state is written anyway.
local function overdrawn(current, next, committed, retry)
  return { admitted = false, next = next, committed = committed, current = current, retry = retry }
end

-- Period and limit as the math uses them (limiter::period_us, limiter::limit).
local function period_of(p)
  return clamp(p.period, 1000, MAX_PERIOD)
end

local function limit_of(p)
  return math.min(p.rate, MAX_COUNT)
end

------------------------------------------------------------------------------------------
-- Token bucket (GCRA), limiter/token_bucket.rs. `tat` is the stored time or nil.
------------------------------------------------------------------------------------------
local function token_bucket(p, tat, now, cost)
  local period = period_of(p)
  local rate = math.min(limit_of(p), period)
  if rate == 0 then
    -- Nothing passes; there is nothing to refill or refund.
    local view = { 0, 0 }
    if cost > 0 then
      return denied(view, nil)
    end
    return unchanged(view)
  end
  local interval = cdiv(period, rate)
  local burst = math.min(p.burst, MAX_COUNT, fdiv(MAX_TOLERANCE, interval))
  local tolerance = burst * interval
  local debt = clamp(tat or now, now, now + MAX_TOLERANCE) - now
  local function view(d)
    if d <= tolerance then
      return { fdiv(tolerance - d, interval), d }
    end
    return { 0, d }
  end
  local current = view(debt)
  local function store(new_debt)
    return commit(current, { tat = now + new_debt, ttl = new_debt }, view(new_debt))
  end
  if cost == 0 then
    if debt <= tolerance then
      return unchanged(current)
    end
    return denied(current, debt - tolerance)
  elseif cost > 0 then
    if cost <= burst and debt + cost * interval <= tolerance then
      return store(debt + cost * interval)
    end
    if p.overdraft then
      -- Into debt beyond tau, capped at 2^50 µs: whole tokens that fit under the cap.
      local new_debt = MAX_TOLERANCE
      if cost <= fdiv(MAX_TOLERANCE - debt, interval) then
        new_debt = debt + cost * interval
      end
      local next = { tat = now + new_debt, ttl = new_debt }
      return overdrawn(current, next, view(new_debt), math.max(new_debt - tolerance, 0))
    end
    if cost > burst then
      return denied(current, nil)
    end
    return denied(current, debt + cost * interval - tolerance)
  end
  local n = math.min(-cost, burst)
  return store(math.max(debt - n * interval, 0))
end

------------------------------------------------------------------------------------------
-- Aligned windows, limiter/window.rs.
------------------------------------------------------------------------------------------
local function plausible(window, period)
  return window >= 0 and window <= fdiv(MAX_NOW, period)
end

-- Where `now` falls, never earlier than the start of `stored_window` (clock stepped back).
local function locate(period, now, stored_window)
  local stored_start = 0
  if stored_window then
    stored_start = stored_window * period
  end
  local effective = math.max(now, stored_start)
  local index = fdiv(effective, period)
  return { period = period, now = now, effective = effective, index = index, start = index * period }
end

------------------------------------------------------------------------------------------
-- Fixed window, limiter/fixed_window.rs. `stored` is {w, c} or nil.
------------------------------------------------------------------------------------------
local function fixed_window(p, stored, now, cost)
  local period = period_of(p)
  local limit = limit_of(p)
  -- A zero count is absent, so it cannot hold the clock in a later window.
  if stored and not (stored.c > 0 and plausible(stored.w, period)) then
    stored = nil
  end
  local pos = locate(period, now, stored and stored.w)
  local count = 0
  if stored and stored.w == pos.index then
    count = math.min(stored.c, MAX_COUNT)
  end
  local until_end = pos.start + period - now
  local function view(c)
    return { math.max(limit - c, 0), until_end }
  end
  local current = view(count)
  if cost == 0 then
    if count <= limit then
      return unchanged(current)
    end
    return denied(current, until_end)
  elseif cost > 0 then
    if cost <= limit and count + cost <= limit then
      return commit(current, { w = pos.index, c = count + cost, ttl = until_end }, view(count + cost))
    end
    if p.overdraft then
      -- Counted anyway, above the limit (capped); checks pass again in the next window.
      local c = math.min(count + math.min(cost, MAX_COUNT), MAX_COUNT)
      return overdrawn(current, { w = pos.index, c = c, ttl = until_end }, view(c), until_end)
    end
    if cost > limit then
      return denied(current, nil)
    end
    return denied(current, until_end)
  end
  local left = count - math.min(-cost, count)
  local ttl = until_end
  if left == 0 then
    ttl = 0
  end
  return commit(current, { w = pos.index, c = left, ttl = ttl }, view(left))
end

------------------------------------------------------------------------------------------
-- Sliding window, limiter/sliding_window.rs. `stored` is {w, c, p} or nil.
------------------------------------------------------------------------------------------

-- The first whole ms `e` into a window at which ceil(previous * w(e) / 65536) <= budget,
-- or nil if none below window_ms (sliding_window::first_ms_within).
local function first_ms_within(previous, budget, window_ms)
  if previous == 0 then
    return 0
  end
  local w_max = fdiv(budget * ONE, previous)
  if w_max >= ONE then
    return 0
  end
  local span = fdiv((w_max + 1) * window_ms - 1, ONE)
  local e = math.max(window_ms - span, 0)
  if e < window_ms then
    return e
  end
  return nil
end

local function sliding_window(p, stored, now, cost)
  local period = period_of(p)
  local limit = limit_of(p)
  -- Zero counters are absent, so they cannot hold the clock in a later window.
  if stored and not ((stored.c > 0 or stored.p > 0) and plausible(stored.w, period)) then
    stored = nil
  end
  local pos = locate(period, now, stored and stored.w)
  -- The stored window rolls: one window back becomes `previous`, older is forgotten.
  local current, previous = 0, 0
  if stored then
    if stored.w == pos.index then
      current, previous = stored.c, stored.p
    elseif stored.w == pos.index - 1 then
      current, previous = 0, stored.c
    end
  end
  local window_ms = fdiv(period, 1000)
  local elapsed_ms = fdiv(pos.effective - pos.start, 1000)
  local weight = fdiv(math.max(window_ms - elapsed_ms, 0) * ONE, window_ms)
  local function at(c, pr)
    return { c = math.min(c, MAX_COUNT), p = math.min(pr, MAX_COUNT) }
  end
  local function estimate(k)
    return cdiv(k.p * weight, ONE) + k.c
  end
  -- µs until the counters are equivalent to absent: the view's reset and the TTL.
  local function forgotten_in(k)
    if k.c > 0 then
      return pos.start + 2 * period - now
    elseif k.p > 0 then
      return pos.start + period - now
    end
    return 0
  end
  local function view(k)
    return { math.max(limit - estimate(k), 0), forgotten_in(k) }
  end
  -- µs until estimate + n <= limit with no other traffic (sliding_window::retry_after).
  local function retry_after(k, n)
    if limit >= k.c + n then
      local e = first_ms_within(k.p, limit - k.c - n, window_ms)
      if e then
        return pos.start + math.max(e * 1000, pos.effective - pos.start) - now
      end
    end
    local e = first_ms_within(k.c, math.max(limit - n, 0), window_ms)
    if e then
      return pos.start + period + e * 1000 - now
    end
    return pos.start + 2 * period - now
  end
  local counters = at(current, previous)
  local current_view = view(counters)
  local est = estimate(counters)
  local function store(k)
    local next = { w = pos.index, c = k.c, p = k.p, ttl = forgotten_in(k) }
    return commit(current_view, next, view(k))
  end
  if cost == 0 then
    if est <= limit then
      return unchanged(current_view)
    end
    return denied(current_view, retry_after(counters, 0))
  elseif cost > 0 then
    if cost <= limit and est + cost <= limit then
      return store(at(counters.c + cost, counters.p))
    end
    if p.overdraft then
      -- Counted anyway, above the limit (`at` caps); wait until a check passes.
      local k = at(counters.c + math.min(cost, MAX_COUNT), counters.p)
      local next = { w = pos.index, c = k.c, p = k.p, ttl = forgotten_in(k) }
      return overdrawn(current_view, next, view(k), retry_after(k, 0))
    end
    if cost > limit then
      return denied(current_view, nil)
    end
    return denied(current_view, retry_after(counters, cost))
  end
  -- Refunds only touch the current window: the previous one is history.
  return store(at(counters.c - math.min(-cost, counters.c), counters.p))
end

------------------------------------------------------------------------------------------
-- Reading and writing state.
------------------------------------------------------------------------------------------

-- pcall: a key of another type answers WRONGTYPE, which must read as absent, not abort.
local function read_tat(key)
  return parse_int(redis.pcall('GET', key))
end

local function read_window(key, sliding)
  local h = redis.pcall('HMGET', key, 'w', 'c', 'p')
  if type(h) ~= 'table' or h.err then
    return nil
  end
  local w, c = parse_int(h[1]), parse_uint(h[2])
  if not (w and c) then
    return nil
  end
  if sliding then
    local p = parse_uint(h[3])
    if not p then
      return nil
    end
    return { w = w, c = c, p = p }
  end
  if h[3] then
    return nil -- a sliding window's counters, not a fixed window's
  end
  return { w = w, c = c }
end

local function fmt(x)
  return string.format('%d', x)
end

local function write(key, algorithm, next)
  if next.ttl == 0 then
    redis.call('DEL', key)
    return
  end
  local ttl_ms = fmt(cdiv(next.ttl, 1000))
  if algorithm == 0 then
    redis.call('SET', key, fmt(next.tat), 'PX', ttl_ms)
    return
  end
  -- DEL first: the key may hold another type or stray fields (only ever after corruption or
  -- a duplicate key in one call), and the stored hash must be exactly the new state.
  redis.call('DEL', key)
  if algorithm == 1 then
    redis.call('HSET', key, 'w', fmt(next.w), 'c', fmt(next.c))
  else
    redis.call('HSET', key, 'w', fmt(next.w), 'c', fmt(next.c), 'p', fmt(next.p))
  end
  redis.call('PEXPIRE', key, ttl_ms)
end

------------------------------------------------------------------------------------------
-- Main.
------------------------------------------------------------------------------------------
local n_ops = #KEYS
if #ARGV ~= 1 + ARGS_PER_OP * n_ops then
  return redis.error_reply(
    'ERR floodgate apply.lua: expected ' .. (1 + ARGS_PER_OP * n_ops) .. ' arguments for '
      .. n_ops .. ' keys, got ' .. #ARGV
  )
end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = parse_int(ARGV[1])
  if not now then
    return redis.error_reply('ERR floodgate apply.lua: now is not an integer')
  end
end
now = clamp(now, 0, MAX_NOW)

-- Phase 1: read and evaluate everything before writing anything.
local ops = {}
local committed = true
for i = 1, n_ops do
  local base = 1 + ARGS_PER_OP * (i - 1)
  local algorithm = parse_uint(ARGV[base + 1])
  local p = {
    rate = parse_uint(ARGV[base + 2]),
    period = parse_uint(ARGV[base + 3]),
    burst = parse_uint(ARGV[base + 4]),
  }
  local cost = parse_int(ARGV[base + 5])
  local enforce = ARGV[base + 6]
  local overdraft = ARGV[base + 7]
  if not (algorithm and p.rate and p.period and p.burst and cost)
    or (enforce ~= '0' and enforce ~= '1')
    or (overdraft ~= '0' and overdraft ~= '1')
  then
    return redis.error_reply('ERR floodgate apply.lua: malformed arguments for key ' .. i)
  end
  p.overdraft = overdraft == '1'
  local key = KEYS[i]
  local e
  if algorithm == 0 then
    e = token_bucket(p, read_tat(key), now, cost)
  elseif algorithm == 1 then
    e = fixed_window(p, read_window(key, false), now, cost)
  elseif algorithm == 2 then
    e = sliding_window(p, read_window(key, true), now, cost)
  else
    return redis.error_reply('ERR floodgate apply.lua: unknown algorithm for key ' .. i)
  end
  -- An overdraft operation never blocks the request (bucket::settle).
  if enforce == '1' and not p.overdraft and not e.admitted then
    committed = false
  end
  ops[i] = { key = key, algorithm = algorithm, e = e, overdraft = p.overdraft }
end

-- Phase 2: all or nothing (bucket::settle).
local reply = { committed and 1 or 0 }
for i = 1, n_ops do
  local op = ops[i]
  local e = op.e
  local view = e.current
  if committed and (e.admitted or op.overdraft) then
    view = e.committed
    if e.next then
      write(op.key, op.algorithm, e.next)
    end
  end
  local retry = e.retry
  if retry == nil then
    retry = -1
  end
  reply[#reply + 1] = e.admitted and 1 or 0
  reply[#reply + 1] = view[1]
  reply[#reply + 1] = view[2]
  reply[#reply + 1] = retry
end
return reply
