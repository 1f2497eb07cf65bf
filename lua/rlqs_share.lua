--[[
floodgate — lua/rlqs_share.lua: settle (or release) one holder's share of one RLQS bucket,
atomically, for every replica sharing this Redis.

It computes exactly what `rlqs::share::settle` computes in Rust (src/rlqs/share.rs is the
specification; docs/rlqs.md explains the scheme): drop the rows past their expiry, set the
holder's demand, compute its fair target (max-min fair on demands, plus an even split among
the holders and one more of what the demands leave), and grant
min(target, capacity - the other live rows' grants).

KEYS[1]  the bucket's share table: configured prefix + "rlqs:" + the table's name
         (rlqs::quota::SharedLimit::table, length-prefixed parts: unambiguous).

ARGV[1]  the holder: replica id + "/" + stream number.
ARGV[2]  "settle" or "release".
ARGV[3]  capacity: tokens per period, all holders together (0 .. 2^32).       (settle only)
ARGV[4]  demand: tokens per period, clamped to capacity by the caller; -1 when unknown
         (the row's previous demand is kept, or the whole capacity is wanted).  (settle only)
ARGV[5]  life: µs the row counts from now (> 0).                                (settle only)
ARGV[6]  optional: "now" in µs since the Unix epoch, instead of Redis TIME; only the
         equivalence test passes it (tests/rlqs.rs), so it can fix time; the key's
         PEXPIRE (real time) is then not touched.                                (settle only)

Storage: a hash; field = holder, value = "<demand> <grant> <expires_us>" (decimal integers;
demand -1 when unknown). Time is Redis TIME (sec * 1000000 + usec), so replicas agree. The
key's PEXPIRE is raised to the longest row life written, plus a second: a table nobody
settles any more disappears; one in use never loses a live row.

Reply: the grant (settle), or 0 (release). Numbers stay below 2^53: exact as Lua doubles.
]]

local key = KEYS[1]
local holder = ARGV[1]
if ARGV[2] == 'release' then
  redis.call('HDEL', key, holder)
  return 0
end
local capacity = tonumber(ARGV[3])
local demand = tonumber(ARGV[4])
local life = tonumber(ARGV[5])
local now
local fixed = ARGV[6] and ARGV[6] ~= ''
if fixed then
  now = tonumber(ARGV[6])
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- Rust: the `retain` and the previous demand of `settle`.
local rows = redis.call('HGETALL', key)
local demands, grants = {}, {}
local previous = -1
for i = 1, #rows, 2 do
  local d, g, e = string.match(rows[i + 1], '^(%-?%d+) (%d+) (%-?%d+)$')
  if rows[i] == holder then
    previous = tonumber(d)
  elseif tonumber(e) <= now then
    redis.call('HDEL', key, rows[i])
  else
    demands[#demands + 1] = tonumber(d)
    grants[#grants + 1] = tonumber(g)
  end
end
if demand < 0 then
  demand = previous
end

-- Rust: `fair_target`.
local function want(d)
  if d < 0 or d > capacity then
    return capacity
  end
  return d
end
local wants = { want(demand) }
for _, d in ipairs(demands) do
  wants[#wants + 1] = want(d)
end
table.sort(wants)
local count = #wants
local remaining = capacity
local level = 0
for i, w in ipairs(wants) do
  local even = math.floor(remaining / (count - i + 1))
  local take = math.min(w, even)
  remaining = remaining - take
  if take > level then
    level = take
  end
end
local target = math.min(want(demand), level) + math.floor(remaining / (count + 1))

-- Rust: the grant of `settle`.
local others = 0
for _, g in ipairs(grants) do
  others = others + g
end
local grant = math.min(target, math.max(capacity - others, 0))
redis.call('HSET', key, holder, string.format('%d %d %d', demand, grant, now + life))
local keep = math.ceil(life / 1000) + 1000
-- A fixed time is not Redis's: the key's (real-time) expiry is left alone then.
if not fixed and redis.call('PTTL', key) < keep then
  redis.call('PEXPIRE', key, keep)
end
return grant
