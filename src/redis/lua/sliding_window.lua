-- Sliding window counter. Mirrors `SlidingCounter::step` and
-- `SlidingCounter::refund` in src/algo/sliding.rs, in microseconds.
--
-- Parameters: W = window length (us); L = limit; unused.
-- State: "id:prev:cur", the window id, the cost admitted in window id - 1
-- and in window id. Absent = window 0, nothing admitted.
-- TTL: to the end of the window after the state's (two windows from its
-- start), when both counts have faded out.
--
-- A check of cost n at `now`, with e = the time into the current window:
-- est = prev * (W - e) / W + cur, rounded up exactly as
-- prev - floor(prev * e / W); allowed iff est + n <= L. A denial writes
-- nothing.

-- The state seen at `now`: id, window start, prev, cur, e.
local function sliding_view(s, now, W)
  local nid = idiv(now, W)
  local id, pv, c = s[1], s[2], s[3]
  if nid <= id then
    -- same window, or a clock behind the state's window: the state's window
  elseif nid == id + 1 then
    id, pv, c = nid, c, 0
  else
    id, pv, c = nid, 0, 0
  end
  local start = id * W
  return id, start, pv, c, math.max(now - start, 0)
end

local function sliding_step(key, now, n, W, L)
  local s = parse(redis.call('GET', key), 3) or {0, 0, 0}
  local id, start, pv, c, e = sliding_view(s, now, W)
  local used = pv - idiv(pv * e, W) + c
  local finish = start + W
  if used + n <= L then
    local reset = finish + W - now
    local commit = function()
      redis.call('SET', key, int(id) .. ':' .. int(pv) .. ':' .. int(c + n), 'PX', px(reset))
    end
    return {1, L, L - used - n, 0, reset}, commit
  end
  local retry
  if c + n <= L then
    -- fits in this window once the previous one has faded enough (pv > 0)
    retry = start + W - idiv((L - c - n) * W, pv) - now
  else
    -- next window: the current count becomes the previous one
    local e3 = 0
    if c > 0 then
      e3 = W - idiv((L - n) * W, c)
    end
    retry = finish + e3 - now
  end
  local reset = finish - now
  if c > 0 then
    reset = finish + W - now
  end
  return {0, L, math.max(L - used, 0), retry, reset}, nil
end

-- Gives back n units to the window they came from: the state's current
-- count while it is the current or previous window, or its previous count
-- when the clock is one window behind.
local function sliding_refund(key, now, n, W, L, unused)
  local s = parse(redis.call('GET', key), 3)
  if not s then
    return
  end
  local sid, prev, cur = s[1], s[2], s[3]
  local nid = idiv(now, W)
  if (nid == sid or nid == sid + 1) and cur > 0 then
    cur = math.max(cur - n, 0)
  elseif nid + 1 == sid and prev > 0 then
    prev = math.max(prev - n, 0)
  else
    return
  end
  local idle = (sid + 2) * W - now
  redis.call('SET', key, int(sid) .. ':' .. int(prev) .. ':' .. int(cur), 'PX', px(idle))
end

