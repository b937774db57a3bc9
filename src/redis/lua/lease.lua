-- Leases: one call takes the caller's units and up to `extra` more for the
-- caller's process to admit locally (src/redis/lease.rs; the protocol and
-- the bound are in docs/distributed.md, "Leases"). Runs after prelude.lua
-- and fixed_window.lua (src/redis/script.rs). The local steps it mirrors:
-- a take decides the caller's units as `Gcra::step` (src/algo/gcra.rs,
-- with the live leases' units counted as taken) or `FixedCounter::step`
-- (src/algo/fixed.rs; here fixed_window.lua's own step) does, then sets
-- the lease aside. No local limiter keeps leases of a shared key, so the
-- lease itself is tested against the bound (src/redis/lease_tests.rs).
--
-- GCRA ('g'), the token and leaky bucket, with *reservations*:
--   State: a hash. Field 't' = the TAT (us since 1970, as for gcra.lua);
--   fields 'l:<id>' = "units:end", one per live lease: `units` reserved
--   for that lease's holder until server time `end`.
--   `out` = the sum of the live leases' units. Available to a check at
--   `now`: free = floor((tau - max(TAT - now, 0)) / T) - out.
--   A take of cost n plus `extra`: allowed iff n <= free; TAT' = max(TAT,
--   now) + n*T (the caller's units, as a plain check); m = min(extra,
--   free - n) more are reserved in a new lease field (TAT unchanged).
--   A release of lease `id` that used `u` of its units, at `now`, while
--   the lease is live: TAT' = max(TAT, now) + u*T, and the field goes (its
--   other units are free again). A lease whose `end` has passed is
--   charged as if all its units were used at `end`: TAT' = max(TAT, end) +
--   units*T, in the order of the ends, by the next call (whatever it is),
--   so the result does not depend on when that call comes.
--   TTL: until the bucket is full again with every lease charged.
--
-- Fixed window ('f'): the state of fixed_window.lua ("id:count"); a take
-- counts the caller's n and the lease's m in the current window, and the
-- lease ends with the window. A release gives back the unused units only
-- into the window they were taken from, while it is the current one.
--
-- KEYS[1]: the key's state.
-- ARGV[1]: 'g' or 'f'.
-- ARGV[2]: 't' take (check), 'p' peek (decide, write nothing), 'r' release.
-- ARGV[3]: 't'/'p': the caller's cost n (>= 1). 'r': units used, u.
-- ARGV[4]: 't': extra units wanted (0: a plain check). 'r': the lease's
--          units m (fixed window: u <= m, m - u are given back).
-- ARGV[5..7]: the algorithm's parameters (T, tau, burst | W, L, 0).
-- ARGV[8]: 't': the lease's life in us (GCRA; a window lease ends with it).
-- ARGV[9]: the lease's id ('t', 'r'; fixed window 'r': the window id).
-- ARGV[10], ARGV[11]: 't', GCRA: the id of this holder's previous lease
--          ('' for none) and the units it used, given back first.
-- Reply for 't'/'p': {allowed, limit, remaining, retry_after_us,
--   reset_after_us, granted (the lease's units m), now, end, window id}.
--   A denial writes nothing (but a previous lease given back in the same
--   call is written).
-- Reply for 'r': 1 if units were given back, 0 if the lease had ended.

local now = clock()
local algo, mode = ARGV[1], ARGV[2]
local n, extra = tonumber(ARGV[3]), tonumber(ARGV[4])
local a, b, c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local key = KEYS[1]

-- GCRA: the TAT, the live leases (sorted by end) and their units, and the
-- fields of the leases that have ended. Ended leases are charged here.
local function g_load(T)
  local h = redis.call('HGETALL', key)
  local tat, leases = 0, {}
  for i = 1, #h, 2 do
    local f, v = h[i], h[i + 1]
    if f == 't' then
      tat = tonumber(v)
      if tat == nil then
        error('ratewall: key holds state of another policy')
      end
    elseif string.sub(f, 1, 2) == 'l:' then
      local s = parse(v, 2)
      leases[#leases + 1] = {f, s[1], s[2]}
    else
      error('ratewall: key holds state of another policy')
    end
  end
  table.sort(leases, function(x, y) return x[3] < y[3] end)
  local live, dead, out = {}, {}, 0
  for _, l in ipairs(leases) do
    if l[3] <= now then
      tat = math.max(tat, l[3]) + l[2] * T
      dead[#dead + 1] = l[1]
    else
      live[#live + 1] = l
      out = out + l[2]
    end
  end
  return tat, live, dead, out
end

-- The time until the bucket is full again, every live lease charged at
-- its end (an upper bound when holders release early).
local function g_full(tat, live, T)
  for _, l in ipairs(live) do
    tat = math.max(tat, l[3]) + l[2] * T
  end
  return math.max(tat - now, 0)
end

-- The time until a cost of n is available, live leases charged at their
-- ends (exact unless a holder releases early).
local function g_retry(tat, live, out, n, T, tau)
  local t = now
  for _, l in ipairs(live) do
    local at = math.max(t, tat - tau + (n + out) * T)
    if at <= l[3] then
      return at - now
    end
    tat = math.max(tat, l[3]) + l[2] * T
    out = out - l[2]
    t = l[3]
  end
  return math.max(t, tat - tau + (n + out) * T) - now
end

-- Writes the TAT, drops ended leases, adds `field` = `value` if given, and
-- sets the TTL.
local function g_write(tat, dead, live, T, field, value)
  if #dead > 0 then
    redis.call('HDEL', key, unpack(dead))
  end
  if field then
    redis.call('HSET', key, 't', int(tat), field, value)
  else
    redis.call('HSET', key, 't', int(tat))
  end
  redis.call('PEXPIRE', key, px(g_full(tat, live, T)))
end

-- Gives back lease `id` (live at `now`) that used `used` of its units:
-- the used units are charged now, the others are free again. Whether it
-- was live.
local function g_release(tat, live, dead, id, used, T)
  local field = 'l:' .. id
  for i, l in ipairs(live) do
    if l[1] == field then
      table.remove(live, i)
      dead[#dead + 1] = field
      return math.max(tat, now) + math.min(math.max(used, 0), l[2]) * T, l[2], true
    end
  end
  return tat, 0, false
end

if algo == 'g' then
  local T, tau, burst = a, b, c
  local tat, live, dead, out = g_load(T)
  if mode == 'r' then
    local released
    tat, out, released = g_release(tat, live, dead, ARGV[9], n, T)
    if released then
      g_write(tat, dead, live, T)
      return 1
    end
    return 0
  end
  -- A take may first give back this holder's previous lease (ARGV[10],
  -- used ARGV[11]): one round trip for both.
  local changed = false
  if mode == 't' and ARGV[10] and ARGV[10] ~= '' then
    local units
    tat, units, changed = g_release(tat, live, dead, ARGV[10], tonumber(ARGV[11]), T)
    out = out - units
  end
  local held = math.max(tat - now, 0)
  local free = idiv(math.max(tau - held, 0), T) - out
  if n > free then
    if changed then
      g_write(tat, dead, live, T)
    end
    return {0, burst, math.max(free, 0), g_retry(tat, live, out, n, T, tau),
      g_full(tat, live, T), 0, now, 0, 0}
  end
  local m = math.max(math.min(extra, free - n), 0)
  tat = math.max(tat, now) + n * T
  local finish = 0
  if mode == 't' then
    if m > 0 then
      finish = now + tonumber(ARGV[8])
      local field = 'l:' .. ARGV[9]
      live[#live + 1] = {field, m, finish}
      table.sort(live, function(x, y) return x[3] < y[3] end)
      g_write(tat, dead, live, T, field, int(m) .. ':' .. int(finish))
    else
      g_write(tat, dead, live, T)
    end
  else
    m = 0
  end
  return {1, burst, free - n, 0, g_full(tat, live, T), m, now, finish, 0}
end

-- Fixed window: fixed_window.lua's step, the lease counted with the
-- caller's units.
local W, L = a, b
if mode == 'r' then
  local id, used = fixed_load(key, now, W)
  local wid = tonumber(ARGV[9])
  local back = math.max(extra - n, 0)
  if id ~= wid or idiv(now, W) ~= wid or used == 0 or back == 0 then
    return 0
  end
  fixed_write(key, id, math.max(used - back, 0), (id + 1) * W - now)
  return 1
end
local d, commit, id = fixed_step(key, now, n, W, L)
if d[1] == 0 then
  return {d[1], d[2], d[3], d[4], d[5], 0, now, 0, 0}
end
local m = 0
if mode == 't' then
  m = math.max(math.min(extra, d[3]), 0)
  commit(m)
end
-- The lease's id for a release is the window id.
return {d[1], d[2], d[3], d[4], d[5], m, now, (id + 1) * W, id}
