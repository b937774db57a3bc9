-- Exact sliding window log. Mirrors `SlidingLog::step` and the log's
-- `refund` in src/algo/log.rs, in microseconds.
--
-- Parameters: W = window length (us); L = limit; unused.
-- State: a list [floor, t_1, ..., t_k], k <= L: the time of the latest
-- admission (a clock that steps back is evaluated there, and a refund does
-- not lower it), then one admission time per unit of cost, oldest first.
-- Absent = nothing admitted. Memory: about 10 bytes per entry in a
-- listpack, plus the key (measured in docs/distributed.md).
-- TTL: newest admission + W - now, when every entry has left the window.
-- Lists have no SET ... PX, so a write is followed by PEXPIRE in the same
-- script (one round trip, atomically).
--
-- A check of cost n at `now`: t = max(now, floor); entries with
-- ts + W <= t have left the window (t - W, t]; allowed iff
-- in_window + n <= L, and then the expired entries are dropped and n copies
-- of t appended. A denial writes nothing.

local function log_at(key, i)
  return tonumber(redis.call('LINDEX', key, i))
end

local function log_step(key, now, n, W, L)
  local len = redis.call('LLEN', key)
  local floor = 0
  if len > 0 then
    floor = log_at(key, 0)
    if floor == nil then
      error('ratewall: key holds state of another policy')
    end
  end
  local count = math.max(len - 1, 0)
  local t = math.max(now, floor)
  -- Expired entries sit at the front: scan a few, then binary search.
  local expired = 0
  while expired < count and expired < 4 and log_at(key, 1 + expired) + W <= t do
    expired = expired + 1
  end
  if expired == 4 then
    local lo, hi = 4, count -- the first unexpired entry is in [lo, hi]
    while lo < hi do
      local mid = idiv(lo + hi, 2)
      if log_at(key, 1 + mid) + W <= t then
        lo = mid + 1
      else
        hi = mid
      end
    end
    expired = lo
  end
  local in_window = count - expired
  if in_window + n <= L then
    local commit = function()
      if len > 0 then
        redis.call('LPOP', key, expired + 1) -- the floor and the expired entries
      end
      local ts = int(t)
      local batch = {}
      for i = 1, math.min(n, 1000) do
        batch[i] = ts
      end
      local left = n
      while left > 0 do
        local k = math.min(left, 1000)
        if k < #batch then
          for i = k + 1, #batch do
            batch[i] = nil
          end
        end
        redis.call('RPUSH', key, unpack(batch))
        left = left - k
      end
      redis.call('LPUSH', key, ts)
      redis.call('PEXPIRE', key, px(t + W - now))
    end
    return {1, L, L - in_window - n, 0, t + W - now}, commit
  end
  -- The (in_window + n - L)-th oldest entry in the window must leave first.
  local oldest = log_at(key, expired + in_window + n - L)
  local newest = log_at(key, -1)
  return {0, L, L - in_window, oldest + W - now, newest + W - now}, nil
end

-- Gives back the newest n entries that are still in the window. The floor
-- stays: time does not move back with them. The TTL stays too (it already
-- covers every remaining entry).
local function log_refund(key, now, n, W, L, unused)
  local len = redis.call('LLEN', key)
  if len < 2 then
    return
  end
  local t = math.max(now, log_at(key, 0))
  for i = 1, n do
    if len < 2 or log_at(key, -1) + W <= t then
      return
    end
    redis.call('RPOP', key)
    len = len - 1
  end
end

