--[[
floodgate — lua/rlqs_share.lua: settle (or release, or re-evaluate) one holder's share of
RLQS buckets, atomically, for every replica sharing this Redis.

It computes exactly what `rlqs::share::settle` (and `reassess`) computes in Rust
(src/rlqs/share.rs is the specification; docs/rlqs.md explains the scheme): drop the rows past their expiry, set the
holder's demand, compute its fair target (max-min fair on demands, plus an even split among
the holders and one more of what the demands leave), and grant
min(target, capacity - the other live rows' grants).

KEYS[1]  the bucket's share table: configured prefix + "rlqs:" + the table's name
         (rlqs::quota::SharedLimit::table, length-prefixed parts: unambiguous).
         "reassess" takes one or more tables (KEYS[1..n]); on a Cluster the caller passes
         only tables of one slot.

ARGV[1]  the holder: replica id + "/" + stream number.
ARGV[2]  "settle", "release" or "reassess".
ARGV[3]  capacity: tokens per period, all holders together (0 .. 2^32).       (settle only)
ARGV[4]  demand: tokens per period, clamped to capacity by the caller; -1 when unknown
         (the row's previous demand is kept, or the whole capacity is wanted).  (settle only)
ARGV[5]  life: µs the row counts from now (> 0).                                (settle only)
ARGV[6]  optional: "now" in µs since the Unix epoch, instead of Redis TIME; only the
         equivalence test passes it (tests/rlqs.rs), so it can fix time; the key's
         PEXPIRE (real time) is then not touched.                                (settle only)

"reassess" (`rlqs::share::reassess`: the holder's row re-evaluated on the demands stored,
without a report; nothing written for it unless its grant changes):
ARGV[3]  life: µs the row counts from now if its grant changes (> 0).
ARGV[4]  "now" in µs as for settle's ARGV[6], or "" for Redis TIME.
ARGV[5..4+n]  the capacity of each table, in KEYS order.

Storage: a hash; field = holder, value = "<demand> <grant> <expires_us>" (decimal integers;
demand -1 when unknown). Time is Redis TIME (sec * 1000000 + usec), so replicas agree. The
key's PEXPIRE is raised to the longest row life written, plus a second: a table nobody
settles any more disappears; one in use never loses a live row.

Reply: the grant (settle), 0 (release), or for reassess one integer per table: the new
grant, or -1 (unchanged, or the holder has no live row there). Numbers stay below 2^53:
exact as Lua doubles.
]]

local holder = ARGV[1]
local op = ARGV[2]
if op == 'release' then
  redis.call('HDEL', KEYS[1], holder)
  return 0
end

-- Redis TIME, unless the caller fixed the time (then the keys' real-time expiry is left alone).
local function clock(fixed)
  if fixed and fixed ~= '' then
    return tonumber(fixed), true
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2]), false
end

-- Rust: the `retain` of `settle` / `reassess`. Drops the expired rows of other holders (and
-- the holder's own, unless `keep_own`); returns the holder's row (demand, grant) if present,
-- and the other live rows' demands and grants.
local function load(key, now, keep_own)
  local rows = redis.call('HGETALL', key)
  local own_demand, own_grant
  local demands, grants = {}, {}
  for i = 1, #rows, 2 do
    local d, g, e = string.match(rows[i + 1], '^(%-?%d+) (%d+) (%-?%d+)$')
    if rows[i] == holder and (keep_own or tonumber(e) > now) then
      own_demand, own_grant = tonumber(d), tonumber(g)
    elseif tonumber(e) <= now then
      redis.call('HDEL', key, rows[i])
    else
      demands[#demands + 1] = tonumber(d)
      grants[#grants + 1] = tonumber(g)
    end
  end
  return own_demand, own_grant, demands, grants
end

-- Rust: `fair_target`, then the grant: min(target, capacity - the others' grants).
local function grant_of(capacity, demand, demands, grants)
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
  local others = 0
  for _, g in ipairs(grants) do
    others = others + g
  end
  return math.min(target, math.max(capacity - others, 0))
end

-- Writes the holder's row, and raises the key's expiry to the row's life plus a second: a
-- table nobody settles any more disappears; one in use never loses a live row.
local function store(key, demand, grant, now, life, fixed)
  redis.call('HSET', key, holder, string.format('%d %d %d', demand, grant, now + life))
  local keep = math.ceil(life / 1000) + 1000
  if not fixed and redis.call('PTTL', key) < keep then
    redis.call('PEXPIRE', key, keep)
  end
end

if op == 'reassess' then
  local life = tonumber(ARGV[3])
  local now, fixed = clock(ARGV[4])
  local out = {}
  for k, key in ipairs(KEYS) do
    local capacity = tonumber(ARGV[4 + k])
    local demand, current, demands, grants = load(key, now, false)
    local changed = -1
    if demand then
      local grant = grant_of(capacity, demand, demands, grants)
      if grant ~= current then
        store(key, demand, grant, now, life, fixed)
        changed = grant
      end
    end
    out[k] = changed
  end
  return out
end

-- settle
local key = KEYS[1]
local capacity = tonumber(ARGV[3])
local demand = tonumber(ARGV[4])
local life = tonumber(ARGV[5])
local now, fixed = clock(ARGV[6])
local previous, _, demands, grants = load(key, now, true)
if demand < 0 then
  demand = previous or -1
end
local grant = grant_of(capacity, demand, demands, grants)
store(key, demand, grant, now, life, fixed)
return grant
