-- Elastic limits: a per-key guarantee, a per-key headroom (the ceiling
-- minus the guarantee) and a shared pool, decided in one script, all or
-- nothing. Prepended: prelude.lua and every algorithm file. Mirrors
-- `ElasticLimiter::check_key_n_at` in src/elastic.rs, at one server time.
--
-- KEYS[1]: the key's guarantee state; KEYS[2]: its headroom state;
-- KEYS[3]: the pool's state; KEYS[4]: a bucket pool's interval T (us) when
-- its state was written, with the pool's TTL. All four share one hash
-- tag, so Redis Cluster runs the script on one node.
-- ARGV[1]: cost n (0 <= n <= max(gcap, extra), checked by the caller). A
--   cost of 0 is the decision for one unit, taking nothing (as locally).
-- ARGV[2]: the guarantee's and headroom's algorithm ('g', 'f', 's', 'l').
-- ARGV[3..5]: the guarantee's parameters; ARGV[6]: its capacity gcap.
-- ARGV[7..9]: the headroom's parameters.
-- ARGV[10]: the pool's algorithm; ARGV[11..13]: its parameters.
-- ARGV[14]: extra = min(headroom capacity, pool capacity).
-- Reply: {allowed, limit, remaining, retry_after_us, reset_after_us,
--   above_limit}: the guarantee's limit and remaining, as locally.
--
-- 1. Take n from the guarantee: if it allows, done (not above the limit).
-- 2. Otherwise step the headroom and the pool; write both only if both
--    allow (then the request passes above the limit). A denial writes
--    nothing to any of the keys.

local steps = {g = gcra_step, f = fixed_step, s = sliding_step, l = log_step}
local now = clock()
local n = tonumber(ARGV[1])
local take = n > 0
if not take then
  n = 1
end
local kstep = steps[ARGV[2]]
local g1, g2, g3 = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local gcap = tonumber(ARGV[6])
local h1, h2, h3 = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local pstep = steps[ARGV[10]]
local p1, p2, p3 = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local extra = tonumber(ARGV[14])

local gd, gcommit
local g_retry = -1 -- -1: the guarantee can never hold n
if n <= gcap then
  gd, gcommit = kstep(KEYS[1], now, n, g1, g2, g3)
  if gd[1] == 1 then
    if take then
      gcommit()
    end
    return {1, gd[2], gd[3], 0, gd[5], 0}
  end
  g_retry = gd[4]
else
  gd = kstep(KEYS[1], now, 1, g1, g2, g3) -- a peek: its limit and remaining
end

-- A denial: the sooner of "the guarantee has room" and `extra_retry`
-- ("headroom and pool both have room"; -1 never).
local function denied(extra_retry, reset)
  local retry = extra_retry
  if g_retry >= 0 and (retry < 0 or g_retry < retry) then
    retry = g_retry
  end
  return {0, gd[2], gd[3], math.max(retry, 0), math.max(gd[5], reset), 0}
end

if n > extra then
  return denied(-1, 0)
end
-- A bucket pool written under another interval (a quota change, here or
-- on another instance) keeps its units in use, as `set_quota` does
-- locally: used' = floor(held * T' / T), at most tau'. In memory only; it
-- is written with the pool's next take.
local pool_tat = nil
if ARGV[10] == 'g' then
  local written = tonumber(redis.call('GET', KEYS[4]) or '')
  if written and written ~= p1 then
    local tat = gcra_tat(KEYS[3])
    if tat > now then
      local held = tat - now
      local q = idiv(held, written)
      local used = q * p1
      if used < p2 then
        local r = held - q * written
        if r * p1 < 9007199254740992 then
          used = used + idiv(r * p1, written)
        else
          used = used + math.floor(r / written * p1)
        end
      end
      pool_tat = now + math.min(used, p2)
    end
  end
end
local hd, hcommit = kstep(KEYS[2], now, n, h1, h2, h3)
local pd, pcommit = pstep(KEYS[3], now, n, p1, p2, p3, pool_tat)
if hd[1] == 0 then
  return denied(math.max(hd[4], pd[4]), hd[5])
end
if pd[1] == 0 then
  return denied(pd[4], gd[5])
end
if take then
  hcommit()
  pcommit()
  if ARGV[10] == 'g' then
    -- The interval the pool's state now counts in, for as long as it lives.
    local ttl = redis.call('PTTL', KEYS[3])
    if ttl > 0 then
      redis.call('SET', KEYS[4], int(p1), 'PX', int(ttl + 1))
    end
  end
end
return {1, gd[2], gd[3], 0, math.max(gd[5], hd[5]), 1}
