-- Concurrency permits shared through Redis (src/redis/concurrency.rs;
-- docs/concurrency.md, "Across instances: Redis permits"). Runs after
-- prelude.lua (src/redis/script.rs). The local step it mirrors is
-- `algo::concurrency::acquire` (src/algo/concurrency.rs): admit iff the
-- units held + n <= max; a denial takes nothing. Here every permit also
-- carries an expiry, so a holder that stops renewing (a crashed instance)
-- loses its units when it passes.
--
-- State: KEYS[1], a ZSET of the live permits: member '<id>:<units>', score
--   its expiry (server time, us since 1970); KEYS[2], a string: the sum of
--   the members' units. Both keys share the key's hash tag. Every call
--   first drops the permits whose expiry has passed (score <= now) and
--   takes their units off the sum. Both keys live until the latest expiry
--   (PX), and go when nothing is held.
--
-- KEYS[1], KEYS[2]: the permits and their sum.
-- ARGV[1]: 'a' acquire, 'r' release, 'n' renew.
-- ARGV[2]: the expiry, in us from now, of a permit acquired or renewed.
-- 'a': ARGV[3] the units n (>= 1), ARGV[4] the maximum, ARGV[5] the member.
--      Reply {allowed, limit, remaining, retry_after_us, reset_after_us}:
--      retry_after is the time until the first held permit lapses if its
--      holder stops renewing (a hint), reset_after until the last does.
-- 'r': ARGV[3] the member. Reply 1 if it was held, 0 if it had lapsed.
-- 'n': ARGV[3] a count c, ARGV[4 .. 3 + c] members. Each member still held
--      gets the new expiry; one that lapsed is not brought back. Reply: c
--      integers, 1 renewed, 0 lapsed.

local now = clock()
local z, c = KEYS[1], KEYS[2]
local mode, life = ARGV[1], tonumber(ARGV[2])

local function corrupt()
  error('ratewall: key holds state of another policy')
end

local function weight(m)
  local w = tonumber(string.match(m, ':(%d+)$'))
  if w == nil then
    corrupt()
  end
  return w
end

-- Drops the lapsed permits. The units still held, and whether it wrote.
local function purge()
  local dead = redis.call('ZRANGEBYSCORE', z, '-inf', int(now))
  local v = redis.call('GET', c)
  local held = 0
  if v then
    held = tonumber(v)
    if held == nil then
      corrupt()
    end
    for _, m in ipairs(dead) do
      held = held - weight(m)
    end
  else
    -- No sum (never the case after a write of this script): count.
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', z, '(' .. int(now), '+inf')) do
      held = held + weight(m)
    end
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', int(now))
  end
  return math.max(held, 0), #dead > 0
end

-- The time until the first (first = true) or last permit lapses; 0 if none.
local function until_lapse(first)
  local r
  if first then
    r = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  else
    r = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  end
  if #r == 0 then
    return 0
  end
  return math.max(tonumber(r[2]) - now, 0)
end

-- Writes the sum and both keys' TTL (until the last permit lapses); deletes
-- both when nothing is held. The time until the last permit lapses.
local function store(held)
  local ttl = until_lapse(false)
  if held <= 0 or ttl == 0 then
    redis.call('DEL', z, c)
    return 0
  end
  redis.call('SET', c, int(held), 'PX', px(ttl))
  redis.call('PEXPIRE', z, px(ttl))
  return ttl
end

local held, purged = purge()

if mode == 'a' then
  local n, max, member = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
  if held + n > max then
    -- Denied: only the purge is written.
    local reset = until_lapse(false)
    if purged then
      reset = store(held)
    end
    return {0, max, math.max(max - held, 0), until_lapse(true), reset}
  end
  redis.call('ZADD', z, int(now + life), member)
  local reset = store(held + n)
  return {1, max, max - held - n, 0, reset}
end

if mode == 'r' then
  local member = ARGV[3]
  if redis.call('ZREM', z, member) == 1 then
    store(held - weight(member))
    return 1
  end
  if purged then
    store(held)
  end
  return 0
end

-- 'n': renew.
local count = tonumber(ARGV[3])
local out = {}
for i = 1, count do
  local m = ARGV[3 + i]
  if redis.call('ZSCORE', z, m) then
    redis.call('ZADD', z, 'XX', int(now + life), m)
    out[i] = 1
  else
    out[i] = 0
  end
end
store(held)
return out
