--[[
bench/gcra_min.lua: the smallest script that does a token-bucket request's Redis work, the
yardstick for lua/apply.lua's Redis time per call (bench/script_cost.py runs both).

KEYS[i]          bucket i (a string: its theoretical arrival time, whole µs).
ARGV[2i - 1]     bucket i's emission interval in µs (time per token), a decimal integer.
ARGV[2i]         bucket i's tolerance in µs (burst × interval), a decimal integer.
Reply            1 if every bucket admitted one token (and each was written), else 0.

What it does, as apply.lua does: one TIME, one GET per bucket, the GCRA decision per bucket
against the state before the call, and only when every bucket admits, one SET … PX per bucket
(all-or-nothing), in one call.
What it does not do: validate anything, parse a binary ARGV, costs other than 1, refunds,
shadow or overdraft operations, the window algorithms, ticks finer than a µs, clamping to the
Rust limiter's bounds, or the per-bucket reply (remaining, reset, retry-after) the server
needs. It is a floor to compare against, never a limiter.
]]
local n = #KEYS
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local new = {}
for i = 1, n do
  local interval, tolerance = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then
    tat = now
  end
  local next = tat + interval
  if next - now > tolerance then
    return 0
  end
  new[i] = next
end
for i = 1, n do
  redis.call('SET', KEYS[i], string.format('%d', new[i]), 'PX', math.ceil((new[i] - now) / 1000))
end
return 1
