-- GCRA: the token bucket, and the leaky bucket as a meter. Mirrors
-- `Gcra::step` and `Gcra::refund` in src/algo/gcra.rs, in microseconds.
--
-- Parameters: T = the emission interval (us per unit of cost, the local
-- interval rounded up to whole us); tau = burst * T; burst.
-- State: the theoretical arrival time (TAT), us since 1970, as an integer
-- string. Absent = a full bucket (any TAT <= now is one).
-- TTL: TAT - now, the time until the bucket is full again (then the key
-- carries no information and Redis drops it).
--
-- A check of cost n at `now`: held = max(TAT - now, 0); used = held + n*T;
-- allowed iff used <= tau, and then TAT := now + used. A denial writes nothing.

-- The stored TAT, 0 if absent; an error if the key holds anything else.
-- The TAT in a stored value (nil or false if absent); an error if the value
-- is anything else.
local function gcra_parse(v)
  if not v then
    return 0
  end
  local tat = tonumber(v)
  if tat == nil then
    error('ratewall: key holds state of another policy')
  end
  return tat
end

local function gcra_tat(key)
  return gcra_parse(redis.call('GET', key))
end

-- A check of cost n against `tat` at `now`: the five decision fields and,
-- on allow, the new TAT (nil on a denial).
-- The one GCRA test (`gcra_decide` in src/algo/gcra.rs): what the bucket
-- holds at `now`, what it would hold after a cost of n, and whether that
-- fits. lua/batch.lua's fast path runs it too.
local function gcra_fit(tat, now, n, T, tau)
  local held = math.max(tat - now, 0)
  local used = held + n * T
  return held, used, used <= tau
end

local function gcra_decide(tat, now, n, T, tau, burst)
  local held, used, fits = gcra_fit(tat, now, n, T, tau)
  if fits then
    return 1, burst, idiv(tau - used, T), 0, used, now + used
  end
  return 0, burst, idiv(math.max(tau - held, 0), T), used - tau, held, nil
end

-- `tat`, if given, replaces the stored TAT (a pool whose quota changed,
-- rescaled by the elastic script); the key is read otherwise.
local function gcra_step(key, now, n, T, tau, burst, tat)
  local allowed, limit, remaining, retry, reset, new =
    gcra_decide(tat or gcra_tat(key), now, n, T, tau, burst)
  local decision = {allowed, limit, remaining, retry, reset}
  if new then
    return decision, function()
      redis.call('SET', key, int(new), 'PX', px(reset))
    end
  end
  return decision, nil
end

-- Gives back n units: TAT moves back by n*T (not below 0). A bucket that is
-- already full stays as it is.
local function gcra_refund(key, now, n, T, tau, burst)
  local tat = gcra_tat(key)
  if tat <= now then
    return
  end
  local back = math.max(tat - n * T, 0)
  redis.call('SET', key, int(back), 'PX', px(back - now))
end

