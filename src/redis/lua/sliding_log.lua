-- Exact sliding window log. Mirrors `SlidingLog::step` and the log's
-- `refund` in src/algo/log.rs, in microseconds.
--
-- Parameters: W = window length (us); L = limit; unused.
-- State: a list [floor:base, t_1, upto_1, ..., t_k, upto_k], oldest first:
-- the head (one string) holds the time of the latest admission (a clock
-- that steps back is evaluated there, and a refund does not lower it) and
-- the units admitted before the first run; then one run per distinct
-- admission time, two integers each, t_1 < t_2 < ..., where upto_i counts
-- every unit up to and including run i, modulo 2^23 (exact: the list never
-- holds more than L <= 2^20 units, and 2^23 keeps a count in a 24-bit
-- listpack integer), so run i holds upto_i - upto_(i-1) units
-- (upto_0 = base). A cost-n admission is one run, k <= L. Absent =
-- nothing admitted. Memory: about 15 bytes per run in a listpack, plus
-- the key and the head (measured in docs/distributed.md).
-- The previous format ([floor, t_1, ..., t_k], one plain time per unit)
-- is read as it stands, each time a run of one unit (base 0); the first
-- admission rewrites it in this format, equal times merged.
-- TTL: newest admission + W - now, when every run has left the window.
-- Lists have no SET ... PX, so a write is followed by PEXPIRE in the same
-- script (one round trip, atomically).
--
-- A check of cost n at `now`: t = max(now, floor); runs with ts + W <= t
-- have left the window (t - W, t]; in_window = upto_k - upto_expired;
-- allowed iff in_window + n <= L, and then the expired runs are dropped
-- and the n units join the last run if it is at t, else one run (t, upto)
-- is appended. A denial writes nothing.

local LOG_MOD = 8388608 -- 2^23: the runs' counts wrap here

local function log_bad()
  error('ratewall: key holds state of another policy')
end

local function log_int(key, i)
  local v = tonumber(redis.call('LINDEX', key, i))
  if v == nil then
    log_bad()
  end
  return v
end

-- The list's state: {len, k (runs), floor, base, plain}. `plain`: the
-- previous format, where entry i is the time of the i-th unit.
local function log_head(key)
  local len = redis.call('LLEN', key)
  if len == 0 then
    return {len = 0, k = 0, floor = 0, base = 0, plain = false}
  end
  local head = redis.call('LINDEX', key, 0)
  if type(head) ~= 'string' then
    log_bad()
  end
  local f, b = string.match(head, '^(%d+):(%d+)$')
  if f then
    if len % 2 == 0 then
      log_bad()
    end
    return {len = len, k = (len - 1) / 2, floor = tonumber(f), base = tonumber(b), plain = false}
  end
  return {len = len, k = len - 1, floor = log_int(key, 0), base = 0, plain = true}
end

-- Run i's time (1 <= i <= k).
local function log_time(key, s, i)
  if s.plain then
    return log_int(key, i)
  end
  return log_int(key, 2 * i - 1)
end

-- The units admitted up to and including run i (0: before the first).
local function log_upto(key, s, i)
  if i == 0 then
    return s.base
  elseif s.plain then
    return i
  end
  return log_int(key, 2 * i)
end

local function log_headstr(t, base)
  return int(t) .. ':' .. int(base % LOG_MOD)
end

-- Appends `values` to the list in batches (unpack has a stack limit).
local function log_push(key, values)
  for i = 1, #values, 1000 do
    redis.call('RPUSH', key, unpack(values, i, math.min(i + 999, #values)))
  end
end

local function log_step(key, now, n, W, L)
  local s = log_head(key)
  local k = s.k
  local t = math.max(now, s.floor)
  -- Expired runs sit at the front: scan a few, then binary search.
  local expired = 0
  while expired < k and expired < 4 and log_time(key, s, 1 + expired) + W <= t do
    expired = expired + 1
  end
  if expired == 4 then
    local lo, hi = 4, k -- the first unexpired run is in [lo, hi]
    while lo < hi do
      local mid = idiv(lo + hi, 2)
      if log_time(key, s, 1 + mid) + W <= t then
        lo = mid + 1
      else
        hi = mid
      end
    end
    expired = lo
  end
  local before = log_upto(key, s, expired)
  local total = log_upto(key, s, k)
  local newest = 0
  if k > 0 then
    newest = log_time(key, s, k)
  end
  local in_window = (total - before) % LOG_MOD
  if in_window + n <= L then
    local commit = function()
      local upto = int((total + n) % LOG_MOD)
      local ts = int(t)
      if s.plain then
        -- The previous format: rewrite the units still in the window.
        local old = {}
        if k > expired then
          old = redis.call('LRANGE', key, expired + 1, -1)
        end
        local runs, c, last = {}, 0, nil
        for i = 1, #old do
          local v = tonumber(old[i])
          if v == nil then
            log_bad()
          end
          c = c + 1
          if v ~= last then
            runs[#runs + 1] = int(v)
            runs[#runs + 1] = ''
            last = v
          end
          runs[#runs] = int(c)
        end
        if last ~= t then
          runs[#runs + 1] = ts
          runs[#runs + 1] = ''
        end
        runs[#runs] = int(c + n)
        redis.call('DEL', key)
        redis.call('RPUSH', key, log_headstr(t, 0))
        log_push(key, runs)
      else
        if s.len > 0 then
          -- The head and the expired runs.
          redis.call('LPOP', key, 1 + 2 * expired)
        end
        if k > expired and newest == t then
          redis.call('LSET', key, -1, upto) -- the same instant: one run
        else
          redis.call('RPUSH', key, ts, upto)
        end
        redis.call('LPUSH', key, log_headstr(t, before))
      end
      redis.call('PEXPIRE', key, px(t + W - now))
    end
    return {1, L, L - in_window - n, 0, t + W - now}, commit
  end
  -- The (in_window + n - L)-th oldest unit in the window must leave first:
  -- the first run whose count since `before` reaches it.
  local must_leave = in_window + n - L
  local lo, hi = expired + 1, k
  while lo < hi do
    local mid = idiv(lo + hi, 2)
    if (log_upto(key, s, mid) - before) % LOG_MOD < must_leave then
      lo = mid + 1
    else
      hi = mid
    end
  end
  local oldest = log_time(key, s, lo)
  return {0, L, L - in_window, oldest + W - now, newest + W - now}, nil
end

-- Gives back the newest n units that are still in the window. The floor
-- stays: time does not move back with them. The TTL stays too (it already
-- covers every remaining run).
local function log_refund(key, now, n, W, L, unused)
  local s = log_head(key)
  local t = math.max(now, s.floor)
  local left = n
  local k = s.k
  while left > 0 and k > 0 do
    if log_time(key, s, k) + W <= t then
      return
    end
    local upto = log_upto(key, s, k)
    local held = (upto - log_upto(key, s, k - 1)) % LOG_MOD
    if held <= left then
      if s.plain then
        redis.call('RPOP', key)
      else
        redis.call('RPOP', key, 2)
      end
      k = k - 1
      left = left - held
    else
      -- A plain entry holds one unit: only runs get here.
      redis.call('LSET', key, -1, int((upto - left) % LOG_MOD))
      left = 0
    end
  end
end
