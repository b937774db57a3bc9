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
local function gcra_tat(key)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local tat = tonumber(v)
  if tat == nil then
    error('ratewall: key holds state of another policy')
  end
  return tat
end

-- `tat`, if given, replaces the stored TAT (a pool whose quota changed,
-- rescaled by the elastic script); the key is read otherwise.
local function gcra_step(key, now, n, T, tau, burst, tat)
  tat = tat or gcra_tat(key)
  local held = math.max(tat - now, 0)
  local used = held + n * T
  if used <= tau then
    local commit = function(slack)
      redis.call('SET', key, int(now + used), 'PX', px(used, slack))
    end
    return {1, burst, idiv(tau - used, T), 0, used}, commit
  end
  return {0, burst, idiv(math.max(tau - held, 0), T), used - tau, held}, nil
end

-- Gives back n units: TAT moves back by n*T (not below 0). A bucket that is
-- already full stays as it is.
local function gcra_refund(key, now, n, T, tau, burst, slack)
  local tat = gcra_tat(key)
  if tat <= now then
    return
  end
  local back = math.max(tat - n * T, 0)
  redis.call('SET', key, int(back), 'PX', px(back - now, slack))
end

