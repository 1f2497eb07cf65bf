--[[
floodgate — lua/apply.lua: apply every bucket operation of one rate-limit request atomically
(or of each request of a batch, in order, each atomically: see Batch).

It computes exactly what `limiter::evaluate` followed by `bucket::settle` compute in Rust
(src/limiter/ is the specification; docs/algorithms.md explains the math): phase 1 reads every
bucket and evaluates every operation against the state as it was before the call; phase 2
writes the new state of every admitted operation (and of every overdraft debit, admitted or
not) if every enforcing, non-overdraft operation was admitted, and writes nothing otherwise
(a denied request debits nothing: docs/algorithms.md).

KEYS[i]  full Redis key of operation i (configured prefix + BucketKey bytes; for a counter,
         flag 16, the reference server's name: CACHE_KEY_PREFIX + domain + `_`-joined
         entries + `_` + window start in Unix seconds, bucket::ReferenceCounter).

ARGV[1]  "now" in µs since the Unix epoch as a decimal integer, or "" to use Redis TIME
         (sec * 1000000 + usec). The override exists so tests can fix time; production passes "".
ARGV[2]  the operations' numbers, packed: per operation i in order, seven little-endian IEEE
         754 doubles (56 bytes), each a whole number:
         flags                algorithm + 4 * enforce + 8 * overdraft + 16 * counter
                              + 32 * set:
                              algorithm 0 token_bucket, 1 fixed_window, 2 sliding_window;
                              enforce: enforcing (else shadow: evaluated, never blocks the
                              request); overdraft: a debit always applies, into debt beyond
                              the capacity, and never blocks the request; counter: a fixed
                              window shared with reference pods (see Storage), fixed_window
                              only; set: the operator's set (store::Store::set): the stored
                              state is not read but taken as absent (a full bucket), so the
                              operation writes what a full bucket holds after its cost,
                              whatever the key held, in this one atomic call; a set of cost
                              0 deletes the key (a full bucket), its reply the full view
                              with window -1. The server sends set operations
                              non-enforcing, within the capacity, in calls of their own
         then for a token bucket its GCRA constants, which depend on the limit only and which
         the server computes (limiter::Ticks) so that Redis does not on every call:
         interval             T, ticks per token, >= 1 (0: the rate is 0, nothing passes)
         scale                ticks per µs, 10^f for the f fraction digits of the stored tat
         cost                 signed: > 0 debit, 0 check only, < 0 refund
         burst                capacity in tokens (burst * interval <= 2^50)
         wait                 max_wait in ticks (<= 2^50 - burst * interval): a debit that
                              does not fit now but would within this many ticks is admitted,
                              its tokens reserved, with a delay; 0 with overdraft
         or for a window:
         requests_per_period  >= 0
         period_us            >= 0
         cost                 as above
         burst                ignored, except a counter's EXPIRE in seconds, >= 1
         debited_in           a refund of this server's own debit (bucket::BucketOp::debited_in):
                              1 + the index of the window the debit was counted in, which
                              the refund goes back to (a sliding window's previous count once
                              that window is the previous one), or nowhere once the window
                              is gone (limiter::evaluate_refund_of); 0 = the current window
                              (a client's refund, every debit and check); ignored by a counter,
                              whose key names its window
         then for both:
         debited_at           a refund of this server's own debit (bucket::BucketOp::debited_at):
                              1 + the time (µs) the store evaluated the debit at; the refund
                              is dropped (answered as a check, admitted, writing nothing) when
                              the bucket's set marker (below) says it was set at or after that
                              time. 0 = none (every debit, check, set and client's refund)
         Why binary: Lua 5.1 numbers are doubles anyway, and one struct.unpack per operation
         replaces a tonumber (strtod) per value, which with one ARGV string per value was the
         largest part of the script's own work. Values above 2^53 arrive rounded exactly as
         tonumber would have rounded their decimal form.

Batch    ARGV[2], ARGV[3], …: one blob per request, as many requests as the client had ready
         to write together (floodgate's connection merges them: docs/redis.md). KEYS are the
         requests' keys concatenated; request j owns #ARGV[j + 1] / 56 of them, in order. The
         requests are applied in order, each all or nothing on its own and each seeing what
         the earlier ones wrote: exactly what the same calls made one by one compute when
         they all read the same `now` — a batch reads TIME once, and its requests are decided
         at one instant, as if they arrived together (they did, in one write). The reply is
         the requests' replies concatenated. One request is exactly a call of its own.
         A malformed request (see below) in a batch of more than one does not fail the
         others: its reply is committed -1, then the error's code (1 malformed arguments, 2
         unknown algorithm, 3 a counter that is not a fixed window, 4 a counter key without
         a window start), the index of the operation it names (from 1), and 0 in every other
         slot; it writes nothing. Blobs whose lengths do not divide into operations or whose
         operations do not match #KEYS are an error reply for the whole batch.
         A token bucket key that several requests of a batch touch (a hot bucket: every
         request of a descriptor) is read once, with the first GET, and written once, after
         the last request: SET … PX with the last write's TTL, or DEL; its value is carried
         between requests in a table. A window or counter operation on the same key first has
         the write waiting for it done, so it reads and replaces exactly what calls one by one
         leave. The end state and every reply are those of the calls one by one.

Reply    one binary string of 3 + 5 * #KEYS little-endian doubles, each a whole number:
         committed (0/1), delay_us (when committed, the longest delay of an enforcing
         operation admitted with one, else 0), now (the µs the call evaluated at, which a
         refund of its debits names: debited_at), then per operation: admitted (0/1), remaining,
         reset_us, retry_after_us (-1 = never), window (the index of the window a window
         operation's state was written in, -1 when nothing was written and for a token
         bucket: bucket::BucketResult::window). As `bucket::settle`: the view is the
         committed one when committed and (admitted or overdraft), else the current one;
         retry_after_us is 0 when admitted (for an overdraft debit that did not fit: until
         the debited bucket is no longer overdrawn).
         Binary for the same reason as ARGV: Redis turns an array reply into RESP one element
         at a time, which cost more than computing a bucket.
         A malformed call (argument count, blob length, a value that is not a whole number,
         unknown flags or algorithm, a scale below 1) is an error reply starting "ERR floodgate"
         (in a batch, a malformed request's marker reply: see Batch).

Storage  token bucket: a string, the theoretical arrival time as a decimal number of µs
         since the epoch: "<us>" or "<us>.<f digits>", where f (0 to 9) is the precision of
         the limit's ticks (limiter::Tat; f = 0, a plain integer, whenever the time per token
         is a whole number of µs). SET key tat PX ttl.
         fixed window: a hash {w = window index, c = count}.
         counter (flag 16): the reference server's plain integer count, under its key name,
         which ends with the window start in Unix seconds (`_<digits>`): the window is the one
         the key names (the pod's clock chose it, as the reference's does), and `now` is
         clamped into it, so Redis TIME only measures how much of it is left
         (limiter::evaluate_counter). Written INCRBY by the change + EXPIRE burst seconds, as
         the reference writes it; a refund to 0 deletes the key; a key that is not a
         non-negative integer is treated as absent and replaced (SET); one that INCRBY
         refuses (a leading zero, more than 18 digits) is read as its count and replaced.
         The same counter twice in one call (ambiguous names, an override): each op sees the
         count the earlier ones leave, as the reference's sequential INCRBYs do.
         sliding window: a hash {w = window index, c = current count, p = previous count}.
         Every write sets a TTL of ceil(ttl_us / 1000) ms — rounded up, so a key never expires
         before its state is equivalent to absent; a ttl_us of 0 deletes the key instead.
         set marker: a committed set operation (flag 32) also writes, beside its key, the
         string "<now>:<until>" (µs), with PX of ceil((until - now) / 1000) ms: the set's time,
         remembered until `until` = now + limiter::set_memory_us (a token bucket: ceil(burst
         * interval / scale) + 60 s, the longest max_wait; a window or counter: 2 periods;
         none at rate 0), judged against the call's `now`, not the PX. Its name starts with
         the key (an ACL's `~<prefix>*` covers it) and keeps the key's hash slot: key .. "{"
         .. key .. "}~set" for a key with no brace (the key its own hash tag), key .. "~set"
         for a key with a hash tag; a key with a brace but no hash tag (a reference counter
         named by a value with braces) has none, and its refunds are never dropped. Bucket
         and counter keys end with digits, so no marker is any bucket's key.
         A key holding another type, another algorithm's shape (a fixed window hash with a `p`
         field, a sliding one without), or anything that does not parse as the integers above
         is treated as absent, like the Rust treats implausible state; a write replaces it.

Numbers  Lua 5.1 computes in doubles, so every value stays below 2^53 (the Rust bounds:
         now clamped to [0, 2^52], period to [1 ms, 2^36 ms], counts to 2^32 - 1, token bucket
         debt to 2^50 ticks, period * 10^f to 2^52) and only +, -, * and floor division of
         non-negative integers are used (`fdiv`, which corrects the quotient). A token bucket's
         absolute times are only ever formed in whole µs; its fraction is split off the stored
         string, so a tat of 25 significant digits is never one double. Values are written with string.format('%d'),
         which is cheaper than letting Redis format a number argument ("%.17g").

Cost     Every EVALSHA runs this whole chunk, so each closure it creates, each chunk local a
         closure captures and each table is an allocation on every call: the token bucket is
         written inline in the main loop with no helper function and takes its constants
         computed; the window algorithms are built only when a call has a window operation
         (window operations are evaluated after the token buckets), once per batch; a request
         allocates one table for its reply and writes, built at its size, and none per token
         bucket operation; whole µs (the common case) skip the tick arithmetic. A batch pays
         the EVALSHA itself and TIME once for all its requests, a GET and a SET … PX once per
         token bucket key instead of once per request touching it, and allocates three
         tables (the packed replies, the token buckets' values and their writes) and one
         closure. bench/script_cost.py measures the Redis time per call against
         bench/gcra_min.lua, and per request batched.

The same key twice in one request (the planner sums costs per bucket, so it should not
happen): every operation is evaluated against the state before the request and the later operation's
write wins — exactly what the memory store does.
]]

local MAX_NOW = 4503599627370496 -- 2^52 µs, limiter::MAX_NOW_US
local MAX_PERIOD = 68719476736000 -- 2^36 ms in µs, limiter::MAX_PERIOD_US
local MAX_DEBT = 1125899906842624 -- 2^50 ticks, limiter::MAX_DEBT_TICKS
local MAX_COUNT = 4294967295 -- u32::MAX, limiter::MAX_COUNT
local MAX_TAT_DIGITS = 9 -- limiter::MAX_TAT_DIGITS
local OP_FORMAT, OP_BYTES = '<ddddddd', 56 -- one operation's numbers in ARGV[2]
local MAX_WAIT = 60000000 -- limiter::MAX_WAIT_US

-- Locals, not globals: every use of a global is a table lookup.
local floor, min, max = math.floor, math.min, math.max
local tonumber, find, match, type, format = tonumber, string.find, string.match, type, string.format
local spread = unpack -- a table's elements as values
local rcall, rpcall, unpack, pack = redis.call, redis.pcall, struct.unpack, struct.pack

-- Scripts that call TIME and then write must be replicated by effects: the only mode since
-- Redis 7 (which has REDIS_VERSION_NUM), the default since 5; ask for it on older servers.
if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  redis.replicate_commands()
end

------------------------------------------------------------------------------------------
-- Main.
------------------------------------------------------------------------------------------
local argv, keys = ARGV, KEYS
local n_requests = #argv - 1
if n_requests < 1 then
  return redis.error_reply(
    'ERR floodgate apply.lua: expected 2 arguments (now, then one per request), got ' .. #argv
  )
end
if n_requests == 1 then
  local n_ops = #keys
  if #argv[2] ~= OP_BYTES * n_ops then
    return redis.error_reply(
      'ERR floodgate apply.lua: expected ' .. (OP_BYTES * n_ops) .. ' bytes of operations for '
        .. n_ops .. ' keys, got ' .. #argv[2]
    )
  end
else
  -- A batch: each request's blob says how many of KEYS are its own, in order.
  local total = 0
  for request = 1, n_requests do
    local bytes = #argv[request + 1]
    if bytes % OP_BYTES ~= 0 then
      return redis.error_reply(
        'ERR floodgate apply.lua: request ' .. request .. ' has ' .. bytes
          .. ' bytes of operations, not a multiple of ' .. OP_BYTES
      )
    end
    total = total + bytes / OP_BYTES
  end
  if total ~= #keys then
    return redis.error_reply(
      'ERR floodgate apply.lua: expected ' .. total .. ' keys for the operations of '
        .. n_requests .. ' requests, got ' .. #keys
    )
  end
end

-- One `now` for the whole batch: its requests came in one write, and are decided as if they
-- arrived together (one TIME, which costs Redis as much as a GET).
local now
if argv[1] == '' then
  local t = rcall('TIME')
  now = t[1] * 1000000 + t[2] -- arithmetic converts the strings, with no call
elseif find(argv[1], '^%-?%d+$') then
  now = tonumber(argv[1])
else
  return redis.error_reply('ERR floodgate apply.lua: now is not an integer')
end
if now < 0 then
  now = 0
elseif now > MAX_NOW then
  now = MAX_NOW
end

-- The window algorithms (closures, built below at the batch's first window operation, so a
-- batch of token buckets never pays for them), and the reference counters' counts an
-- earlier operation of the request being applied leaves.
local fixed, sliding, counter, pending
local marker_of -- a key's set marker name (see Storage), built at the first call that needs it
local replies -- a batch's packed replies, in request order
local first = 0 -- KEYS before the request being applied: the earlier requests' operations

-- In a batch, each token bucket key is read once and written once: `bucket[key]` is its value
-- as the requests so far left it (false: absent), read with the first GET; `unwritten[key]`
-- is the TTL in ms of the write it waits for (0: a DEL), done once the last request is
-- applied, or before any other operation reads or writes that key (`settle`), so a window or
-- counter operation on it sees and overwrites exactly what calls one by one leave.
local bucket, unwritten, settle
if n_requests > 1 then
  bucket, unwritten = {}, {}
  settle = function(key)
    local ttl_ms = unwritten[key]
    if ttl_ms then
      if ttl_ms == 0 then
        rcall('DEL', key)
      else
        rcall('SET', key, bucket[key], 'PX', ttl_ms)
      end
      unwritten[key] = nil
    end
    bucket[key] = nil
  end
end

for request = 1, n_requests do
  local blob = argv[request + 1]
  local n_ops = #blob / OP_BYTES
  -- A malformed operation (1 malformed arguments, 2 unknown algorithm, 3 a counter that is
  -- not a fixed window, 4 a counter key without a window start) and its index: the request
  -- is refused and writes nothing; the batch's other requests are applied.
  local failed, failed_at
  -- Phase 1: read and evaluate everything before writing anything, token buckets first (here,
  -- inline) and window operations after them (below). Each operation's answer goes straight
  -- into the reply (slots 1 to 3 + 5 * n_ops), with its current view; operation i, if it
  -- writes when the call commits, leaves its write in the 5 slots from the reply's end
  -- + 5 * (i - 1): committed view remaining and reset_us, ttl_us, state, kind (0 token bucket,
  -- 1 fixed window, 2 sliding window, 3 reference counter). Phase 2 writes in operation order,
  -- so of two operations on one key the later one's write wins. A call allocates this one
  -- table and none per operation, built at the size of a 1-operation call (most requests) or
  -- of a 4-operation one: a constructor's nils size a table, and growing one rehashes it at
  -- every power of two, which cost a 4-bucket call more than a bucket's whole evaluation.
  local reply
  if n_ops == 1 then
    reply = { 0, 0, now, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil }
  else
    reply = {
      0, 0, now, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil,
    }
  end
  local reply_end = 3 + 5 * n_ops
  local marked -- the sets' markers to write: name and memory in µs, pairs (only with a set)
  local writes = reply -- the writes, after the reply
  local windows -- the window operations, evaluated after the token buckets (below)
  local committed = true
  local delay = 0 -- the longest delay of an enforcing operation admitted with one
  local pos = 1
  for i = 1, n_ops do
    -- (rate, period, max_wait) of a window are (interval, scale, wait) of a token bucket,
    -- and its `debited_in` comes in the slot of `wait`.
    local flags, rate, period, cost, burst, max_wait, debited_at
    flags, rate, period, cost, burst, max_wait, debited_at, pos = unpack(OP_FORMAT, blob, pos)
    -- `x % 1` is 0 for a whole number, in (0, 1) for a fraction and NaN for NaN and the
    -- infinities: a sum of such terms is 0 only when every term is (none is negative, so
    -- none cancels another), which one comparison checks for all seven values.
    if flags % 1 + rate % 1 + period % 1 + cost % 1 + burst % 1 + max_wait % 1 + debited_at % 1 ~= 0
      or flags < 0 or flags >= 64 or rate < 0 or period < 0 or burst < 0 or max_wait < 0
      or debited_at < 0
    then
      failed, failed_at = 1, i
      break
    end
    local set -- the operator's set: the stored state is taken as absent
    local expiry -- a reference counter's EXPIRE in seconds (its `burst`), nil for a bucket
    local dropped -- a refund answered as a check (below)
    local key = keys[first + i]
    if flags >= 16 or cost < 0 then
      -- A set, a counter or a refund: tested once here, so the commonest operations (debits
      -- and checks of buckets and windows) skip every test below.
      if flags >= 32 then
        set, flags = true, flags - 32
      end
      if flags >= 16 then
        expiry, flags = burst, flags - 16
      end
      -- This operation's set marker (see Storage), for a set or a refund of this server's own
      -- debit; the function naming it is built at a call's first such operation.
      local marker
      if set or (cost < 0 and debited_at > 0) then
        if not marker_of then
          marker_of = function(k)
            local open = find(k, '{', 1, true)
            if not open then
              if find(k, '}', 1, true) then
                return nil
              end
              return k .. '{' .. k .. '}~set' -- the key itself as its hash tag
            end
            local close = find(k, '}', open + 1, true)
            if close and close > open + 1 then
              return k .. '~set' -- its hash tag, hence its slot, kept
            end
            return nil
          end
        end
        marker = marker_of(key)
      end
      if set and marker then
        -- How long the set is remembered (limiter::set_memory_us); written in phase 2.
        local memory
        if flags % 4 == 0 and not expiry then
          memory = 0
          if rate > 0 then
            memory = floor((burst * rate + period - 1) / period) + MAX_WAIT
          end
        else
          memory = 2 * min(max(period, 1000), MAX_PERIOD)
        end
        if memory > 0 then
          if not marked then
            marked = {}
          end
          marked[#marked + 1], marked[#marked + 2] = marker, memory
        end
      end
      -- A refund of a debit made at or before a set of the bucket its marker remembers: the
      -- debit is no longer there, so the refund is answered as a check, writing nothing.
      if marker and not set then
        local v = rpcall('GET', marker)
        if type(v) == 'string' then
          local at, untl = match(v, '^(%d+):(%d+)$')
          if at and now < tonumber(untl) and tonumber(at) >= debited_at - 1 then
            cost, dropped = 0, true
          end
        end
      end
    end
    local algorithm = flags % 4
    local enforce = flags % 8 >= 4
    local overdraft = flags >= 8
    -- This operation's answer: admitted, retry_after_us (-1 = never) and the current view.
    local admitted, retry, remaining, reset
    if algorithm == 0 and not expiry then
      ----------------------------------------------------------------------------------------
      -- Token bucket (GCRA), limiter/token_bucket.rs, inline: every helper function would be
      -- a closure allocated per call. The math runs in ticks of 10^-digits µs; the constants
      -- (Gcra::new) come computed.
      ----------------------------------------------------------------------------------------
      local interval, scale, wait = rate, period, max_wait
      if scale < 1 then
        failed, failed_at = 1, i
        break
      end
      if interval == 0 then
        -- Rate 0: nothing passes; there is nothing to refill or refund.
        admitted, remaining, reset = cost <= 0, 0, 0
        retry = admitted and 0 or -1
        if set and cost == 0 then
          local w = reply_end + 5 * (i - 1)
          writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4], writes[w + 5] = 0, 0, 0, '', 0
        end
      else
        local tolerance = burst * interval
        local digits = 0 -- scale = 10^digits
        if scale > 1 then
          local s = scale
          repeat
            digits, s = digits + 1, s / 10
          until s <= 1
        end
        -- The stored tat, "<us>" or "<us>.<1 to 9 digits>" (limiter::Tat::parse); a key of
        -- another type (pcall: WRONGTYPE) or an unreadable value is an absent bucket.
        local stored
        if set then
          stored = false
        elseif bucket then
          stored = bucket[key]
          if stored == nil then
            stored = rpcall('GET', key)
            if type(stored) ~= 'string' then
              stored = false
            end
            bucket[key] = stored
          end
        else
          stored = rpcall('GET', key)
        end
        local tat_us, tat_frac, tat_digits
        if type(stored) == 'string' then
          -- A whole-µs limit stores an integer, a limit in finer ticks a fraction: the shape
          -- the limit writes is tried first (a string has at most one of them).
          if scale == 1 and find(stored, '^%-?%d+$') then
            tat_us, tat_frac, tat_digits = tonumber(stored), 0, 0
          else
            local whole, fraction = match(stored, '^(%-?%d+)%.(%d+)$')
            if whole then
              if #fraction <= MAX_TAT_DIGITS then
                tat_us, tat_frac, tat_digits = tonumber(whole), tonumber(fraction), #fraction
              end
            elseif scale > 1 and find(stored, '^%-?%d+$') then
              tat_us, tat_frac, tat_digits = tonumber(stored), 0, 0
            end
          end
        end
        -- Gcra::debt: tat − now in ticks, within [0, 2^50]; extra stored digits round it up.
        local debt = 0
        if tat_us and tat_us >= now then
          if tat_digits == 0 and scale == 1 then
            -- Whole µs, the common case: no fraction to align.
            debt = tat_us - now
            if debt > MAX_DEBT then
              debt = MAX_DEBT
            end
          elseif tat_us - now > floor(MAX_DEBT / scale) then
            debt = MAX_DEBT
          else
            local frac, unit = tat_frac, 1
            for _ = digits + 1, tat_digits do
              unit = unit * 10
            end
            if tat_digits <= digits then
              for _ = tat_digits + 1, digits do
                frac = frac * 10
              end
            else
              frac = floor((frac + unit - 1) / unit)
            end
            debt = min((tat_us - now) * scale + frac, MAX_DEBT)
          end
        end
        -- The view `debt` ticks in debt: whole tokens left, µs until full (rounded up).
        remaining, reset = 0, debt
        if scale > 1 then
          reset = floor((debt + scale - 1) / scale)
        end
        if debt <= tolerance then
          -- floor(a / b) as (a - a % b) / b: Lua's `%` is a - floor(a / b) * b, exact below
          -- 2^53, so the same quotient, computed in the VM instead of by a call of math.floor.
          local spare = tolerance - debt
          remaining = (spare - spare % interval) / interval
        end
        local new_debt, shaped -- the debt to store, if any; the delay of a shaped debit
        if cost == 0 and set then
          -- A full bucket, stored as what it is: no key (ttl 0 deletes).
          new_debt, admitted, retry = 0, true, 0
        elseif cost == 0 then
          admitted = debt <= tolerance
          retry = admitted and 0 or floor((debt - tolerance + scale - 1) / scale)
        elseif cost > 0 then
          new_debt = debt + cost * interval
          admitted = cost <= burst and new_debt <= tolerance
          if not admitted and not overdraft and cost <= burst and new_debt - tolerance <= wait then
            -- Shaped: reserved now, answered when its tokens would have been there.
            admitted, shaped = true, floor((new_debt - tolerance + scale - 1) / scale)
          end
          if admitted then
            retry = 0
          elseif overdraft then
            -- Into debt beyond tau, capped at 2^50 ticks: whole tokens that fit under the cap;
            -- retry until the debited bucket is no longer overdrawn.
            if cost > floor((MAX_DEBT - debt) / interval) then
              new_debt = MAX_DEBT
            end
            retry = floor((max(new_debt - tolerance, 0) + scale - 1) / scale)
          else
            if cost > burst then
              retry = -1
            else
              retry = floor((new_debt - tolerance - wait + scale - 1) / scale)
            end
            new_debt = nil
          end
        else
          new_debt, admitted, retry = max(debt - min(-cost, burst) * interval, 0), true, 0
        end
        if new_debt then
          -- A debit or refund to store: the committed view, and the tat `new_debt` ticks after
          -- now as limiter::Tat displays it; the bucket is full again (absent) when it expires.
          local kr, ks = 0, new_debt
          if new_debt <= tolerance then
            local spare = tolerance - new_debt
            kr = (spare - spare % interval) / interval -- floor(spare / interval), as above
          end
          local tat
          if scale == 1 then
            tat = format('%d', now + new_debt)
          else
            ks = floor((new_debt + scale - 1) / scale)
            local whole = floor(new_debt / scale)
            -- A constant format per digit count: building one ('%0' .. digits) would turn the
            -- number into a string through "%.14g", and a table of them is an allocation per
            -- call; the comparisons cost less, fewest for the commonest (fewest) digits.
            local fraction_format
            if digits == 1 then
              fraction_format = '%d.%01d'
            elseif digits == 2 then
              fraction_format = '%d.%02d'
            elseif digits == 3 then
              fraction_format = '%d.%03d'
            elseif digits == 4 then
              fraction_format = '%d.%04d'
            elseif digits == 5 then
              fraction_format = '%d.%05d'
            elseif digits == 6 then
              fraction_format = '%d.%06d'
            elseif digits == 7 then
              fraction_format = '%d.%07d'
            elseif digits == 8 then
              fraction_format = '%d.%08d'
            else
              fraction_format = '%d.%09d'
            end
            tat = format(fraction_format, now + whole, new_debt - whole * scale)
          end
          local w = reply_end + 5 * (i - 1)
          writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4], writes[w + 5] = kr, ks, ks, tat, 0
          if shaped and enforce then
            delay = max(delay, shaped)
          end
        end
      end
    elseif algorithm == 3 then
      failed, failed_at = 2, i
      break
    elseif expiry and algorithm ~= 1 then
      failed, failed_at = 3, i
      break
    else
      -- A window operation: evaluated after this loop, with the window algorithms.
      if not windows then
        windows = {}
      end
      local n = #windows
      windows[n + 1], windows[n + 2], windows[n + 3], windows[n + 4] = i, algorithm, rate, period
      windows[n + 5], windows[n + 6], windows[n + 7], windows[n + 8] = cost, overdraft, enforce, expiry or false
      -- 1 + the window a refund's debit was counted in, or false: the current window.
      windows[n + 9] = max_wait > 0 and max_wait - 1
      windows[n + 10] = set or false
      windows[n + 11] = dropped or false
    end
    if dropped and admitted ~= nil then
      admitted, retry = true, 0 -- a dropped refund, answered as a check that never denies
    end
    if admitted ~= nil then
      -- An overdraft operation never blocks the request (bucket::settle).
      if enforce and not overdraft and not admitted then
        committed = false
      end
      local r = 5 * i - 2
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = admitted and 1 or 0, remaining, reset, retry
      reply[r + 5] = -1 -- a token bucket has no window
    end
  end

  ------------------------------------------------------------------------------------------
  -- Phase 1, window operations (11 slots each in `windows`: index, algorithm, rate, period,
  -- cost, overdraft, enforce, a counter's expiry or false, the window a refund's debit was
  -- counted in or false, set, a dropped refund), in their order. Their algorithms are
  -- closures, built here once per batch, so only a batch that has a window operation pays
  -- for them.
  ------------------------------------------------------------------------------------------
  if windows and not failed then
    if not fixed then
      -- A window operation's evaluation (limiter::Evaluation) is one table: [1] admitted, [2]
      -- retry (µs until the cost could pass, -1 = never), [3] [4] the current view (remaining,
      -- reset_us), [5] [6] the committed view, [7] when there is a state to write, its ttl in µs
      -- (0 deletes), and the state: the fields w, c[, p] (a counter: also base, replace, expiry).
      local ONE = 65536 -- fixed-point one of the sliding window's weight

      -- floor(a / b) for integers 0 <= a, 0 < b, both below 2^53: the double quotient may round to
      -- a neighbour, so correct it until q * b <= a < (q + 1) * b (limiter::window::floor_div).
      local function fdiv(a, b)
        local q = floor(a / b)
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

      -- A decimal integer (optionally negative), or nil for anything else (false, floats, junk).
      local function parse_int(s)
        if type(s) == 'string' and find(s, '^%-?%d+$') then
          return tonumber(s)
        end
        return nil
      end

      -- A non-negative decimal integer, or nil.
      local function parse_uint(s)
        if type(s) == 'string' and find(s, '^%d+$') then
          return tonumber(s)
        end
        return nil
      end

      -- The windows build limiter::Evaluation as nested tables, then flatten it (`flat`).
      -- A view is {remaining, reset_us}; retry nil = never.
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
        return min(max(p.period, 1000), MAX_PERIOD)
      end

      local function limit_of(p)
        return min(p.rate, MAX_COUNT)
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
        local effective = max(now, stored_start)
        local index = fdiv(effective, period)
        return { period = period, now = now, effective = effective, index = index, start = index * period }
      end

      ------------------------------------------------------------------------------------------
      -- Fixed window, limiter/fixed_window.rs. `stored` is {w, c} or nil.
      ------------------------------------------------------------------------------------------
      -- `debited` (or nil): the window a refund's debit was counted in (limiter::evaluate_refund_of).
      local function fixed_window(p, stored, now, cost, debited)
        local period = period_of(p)
        local limit = limit_of(p)
        -- A zero count is absent, so it cannot hold the clock in a later window.
        if stored and not (stored.c > 0 and plausible(stored.w, period)) then
          stored = nil
        end
        local pos = locate(period, now, stored and stored.w)
        local count = 0
        if stored and stored.w == pos.index then
          count = min(stored.c, MAX_COUNT)
        end
        local until_end = pos.start + period - now
        local function view(c)
          return { max(limit - c, 0), until_end }
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
            local c = min(count + min(cost, MAX_COUNT), MAX_COUNT)
            return overdrawn(current, { w = pos.index, c = c, ttl = until_end }, view(c), until_end)
          end
          if cost > limit then
            return denied(current, nil)
          end
          return denied(current, until_end)
        end
        if debited and debited ~= pos.index then
          -- The debit's window has ended: the current window never counted it.
          return unchanged(current)
        end
        local left = count - min(-cost, count)
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
        local e = max(window_ms - span, 0)
        if e < window_ms then
          return e
        end
        return nil
      end

      local function sliding_window(p, stored, now, cost, debited)
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
        local weight = fdiv(max(window_ms - elapsed_ms, 0) * ONE, window_ms)
        local function at(c, pr)
          return { c = min(c, MAX_COUNT), p = min(pr, MAX_COUNT) }
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
          return { max(limit - estimate(k), 0), forgotten_in(k) }
        end
        -- µs until estimate + n <= limit with no other traffic (sliding_window::retry_after).
        local function retry_after(k, n)
          if limit >= k.c + n then
            local e = first_ms_within(k.p, limit - k.c - n, window_ms)
            if e then
              return pos.start + max(e * 1000, pos.effective - pos.start) - now
            end
          end
          local e = first_ms_within(k.c, max(limit - n, 0), window_ms)
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
            local k = at(counters.c + min(cost, MAX_COUNT), counters.p)
            local next = { w = pos.index, c = k.c, p = k.p, ttl = forgotten_in(k) }
            return overdrawn(current_view, next, view(k), retry_after(k, 0))
          end
          if cost > limit then
            return denied(current_view, nil)
          end
          return denied(current_view, retry_after(counters, cost))
        end
        if debited and debited == pos.index - 1 then
          -- Counted in the previous window, which the estimate still weighs.
          return store(at(counters.c, counters.p - min(-cost, counters.p)))
        elseif debited and debited ~= pos.index then
          return unchanged(current_view) -- forgotten already
        end
        -- A refund into the current window (its own, or a client's is_negative_hits).
        return store(at(counters.c - min(-cost, counters.c), counters.p))
      end

      local function read_window(key, sliding)
        local h = rpcall('HMGET', key, 'w', 'c', 'p')
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

      -- The evaluation in the main loop's shape (see the top of the chunk).
      local function flat(e)
        local f = {
          e.admitted, e.retry or -1, e.current[1], e.current[2], e.committed[1], e.committed[2],
        }
        local next = e.next
        if next then
          f[7], f.w, f.c, f.p = next.ttl, next.w, next.c, next.p
        end
        return f
      end

      -- `set`: the stored state is taken as absent (the flag's header note).
      function fixed(rate, period, overdraft, key, now, cost, debited, set)
        local p = { rate = rate, period = period, overdraft = overdraft }
        local stored = nil
        if not set then
          stored = read_window(key, false)
        end
        return flat(fixed_window(p, stored, now, cost, debited))
      end

      function sliding(rate, period, overdraft, key, now, cost, debited, set)
        local p = { rate = rate, period = period, overdraft = overdraft }
        local stored = nil
        if not set then
          stored = read_window(key, true)
        end
        return flat(sliding_window(p, stored, now, cost, debited))
      end

      ----------------------------------------------------------------------------------------
      -- Reference counter, limiter::evaluate_counter: a fixed window whose count is a plain
      -- integer and whose window is named by the key. `pending[key]` is the count an earlier op
      -- of this call leaves (if the call commits). Returns nil for a key without a window start.
      ----------------------------------------------------------------------------------------
      function counter(rate, period, overdraft, key, now, cost, set)
        local start_s = match(key, '_(%d+)$')
        if not start_s then
          return nil
        end
        local p = { rate = rate, period = period, overdraft = overdraft }
        local window = period_of(p)
        local index = fdiv(min(tonumber(start_s) * 1000000, MAX_NOW), window)
        local start = index * window
        local at = min(max(now, start), start + window - 1, MAX_NOW)
        local count, replace = pending[key], false
        if set then
          -- Whatever the key holds is replaced (SET), not changed by INCRBY.
          count, replace = nil, true
        elseif count == nil then
          local v = rpcall('GET', key)
          if type(v) == 'table' or v then
            count = parse_uint(v)
            -- Another type, or not an integer: overwritten with SET. So is a count INCRBY
            -- refuses (a leading zero, more digits than an int64 surely has), read as the
            -- count it shows: INCRBY's error would fail the call (in a batch, every request).
            replace = count == nil or #v > 18 or (#v > 1 and find(v, '^0') ~= nil)
          end
        end
        local stored = nil
        if count then
          stored = { w = index, c = count }
        end
        local e = flat(fixed_window(p, stored, at, cost))
        -- The count the evaluation read, from which the write is a change (capped like the
        -- limiter caps it; a zero or unreadable count is 0).
        e.base, e.replace = min(count or 0, MAX_COUNT), replace
        if e[7] then
          pending[key] = e.c
        end
        return e
      end
    end

    pending = {} -- reference counters: the count an earlier op of this request leaves
    for j = 1, #windows, 11 do
      local i, algorithm, rate, period = windows[j], windows[j + 1], windows[j + 2], windows[j + 3]
      local cost, overdraft, enforce, expiry = windows[j + 4], windows[j + 5], windows[j + 6], windows[j + 7]
      local debited, set, dropped = windows[j + 8] or nil, windows[j + 9], windows[j + 10]
      local key = keys[first + i]
      if bucket then
        settle(key) -- it reads what the earlier requests wrote
      end
      local e, kind
      if expiry then
        e, kind = counter(rate, period, overdraft, key, now, cost, set), 3
        if not e then
          failed, failed_at = 4, i
          break
        end
        e.expiry = expiry
      elseif algorithm == 1 then
        e, kind = fixed(rate, period, overdraft, key, now, cost, debited, set), 1
      else
        e, kind = sliding(rate, period, overdraft, key, now, cost, debited, set), 2
      end
      if set and cost == 0 then
        -- A full bucket: the key deleted, written as a token bucket's deletion is (no window
        -- in the reply), the view the current one (of an absent state).
        e[5], e[6], e[7], kind = e[3], e[4], 0, 0
      end
      local admitted = e[1]
      if dropped then
        admitted, e[2] = true, 0 -- a dropped refund, answered as a check that never denies
      end
      -- A state to write: written if the call commits and the operation was admitted or is an
      -- overdraft debit (bucket::settle); otherwise the committed view is the current one.
      if e[7] and (admitted or overdraft) then
        local w = reply_end + 5 * (i - 1)
        writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4], writes[w + 5] = e[5], e[6], e[7], e, kind
      end
      -- An overdraft operation never blocks the request (bucket::settle).
      if enforce and not overdraft and not admitted then
        committed = false
      end
      local r = 5 * i - 2
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = admitted and 1 or 0, e[3], e[4], e[2]
      reply[r + 5] = -1 -- the window, once written (phase 2)
    end
  end

  if failed then
    -- A malformed request: alone, an error reply; in a batch, its reply says so (committed
    -- -1, then the error's code and the operation it names, the rest 0) and the other
    -- requests go on.
    if n_requests == 1 then
      local what
      if failed == 1 then
        what = 'malformed arguments for key '
      elseif failed == 2 then
        what = 'unknown algorithm for key '
      elseif failed == 3 then
        what = 'a counter must be a fixed window, key '
      else
        what = 'no window start in counter key '
      end
      return redis.error_reply('ERR floodgate apply.lua: ' .. what .. failed_at)
    end
    for r = 4, reply_end do
      reply[r] = 0
    end
    reply[1], reply[2], reply[3] = -1, failed, failed_at
    committed = false
  end

  -- Phase 2: all or nothing (bucket::settle): every write, and its committed view in the
  -- reply, or nothing. Every write sets a TTL of ceil(ttl / 1 ms).
  if committed then
    reply[1], reply[2] = 1, delay
    for i = 1, n_ops do
      local w = reply_end + 5 * (i - 1)
      local ttl, state, kind = writes[w + 3], writes[w + 4], writes[w + 5]
      if ttl then
        -- The committed view (without a write, the current one is the committed one), and a
        -- window's index, which a refund of this debit names.
        reply[5 * i], reply[5 * i + 1] = writes[w + 1], writes[w + 2]
        local key = keys[first + i]
        if kind ~= 0 then
          reply[5 * i + 3] = state.w
          if bucket then
            settle(key) -- a token bucket's write waiting on this key goes first
          end
        end
        if kind == 0 and not bucket then
          -- A token bucket of a call of its own, the commonest write, tested first.
          if ttl == 0 then
            rcall('DEL', key)
          else
            -- ceil(ttl / 1000): '%d' truncates, which for a non-negative number is floor.
            rcall('SET', key, state, 'PX', format('%d', (ttl + 999) / 1000))
          end
        elseif bucket and kind == 0 then
          -- In a batch: written once, after the last request (`bucket`).
          if ttl == 0 then
            bucket[key], unwritten[key] = false, 0
          else
            bucket[key], unwritten[key] = state, format('%d', (ttl + 999) / 1000)
          end
        elseif kind == 3 then
          -- The reference's integer: INCRBY the change, EXPIRE its unit + jitter (its `burst`).
          local expiry = format('%d', max(state.expiry, 1))
          if ttl == 0 then
            rcall('DEL', key)
          elseif state.replace then
            rcall('SET', key, format('%d', state.c), 'EX', expiry)
          else
            rcall('INCRBY', key, format('%d', state.c - state.base))
            rcall('EXPIRE', key, expiry)
          end
        elseif ttl == 0 then
          rcall('DEL', key)
        else
          -- A window's hash. DEL first: the key may hold another type or stray fields (only
          -- ever after corruption or a duplicate key in one call), and the hash must be
          -- exactly the state. The TTL is ceil(ttl / 1000) ms as a token bucket's.
          rcall('DEL', key)
          if kind == 1 then
            rcall('HSET', key, 'w', format('%d', state.w), 'c', format('%d', state.c))
          else
            rcall('HSET', key, 'w', format('%d', state.w), 'c', format('%d', state.c), 'p', format('%d', state.p))
          end
          rcall('PEXPIRE', key, format('%d', (ttl + 999) / 1000))
        end
      end
    end
    -- The sets' markers: when each bucket was set, and until when that is remembered.
    if marked then
      for j = 1, #marked, 2 do
        local memory = marked[j + 1]
        rcall('SET', marked[j], format('%d:%d', now, now + memory), 'PX', format('%d', (memory + 999) / 1000))
      end
    end
  end

  -- The reply, packed: a constant format up to 4 operations (string.rep makes a new string).
  local reply_format
  if n_ops == 1 then
    reply_format = '<dddddddd'
  elseif n_ops == 2 then
    reply_format = '<ddddddddddddd'
  elseif n_ops == 3 then
    reply_format = '<dddddddddddddddddd'
  elseif n_ops == 4 then
    reply_format = '<ddddddddddddddddddddddd'
  else
    reply_format = '<' .. string.rep('d', reply_end)
  end
  if n_requests == 1 then
    return pack(reply_format, spread(reply, 1, reply_end))
  end
  if not replies then
    replies = {}
  end
  replies[request] = pack(reply_format, spread(reply, 1, reply_end))
  first = first + n_ops
end
for key in pairs(unwritten) do
  settle(key)
end
return table.concat(replies)
