-- Fixed window counter. Mirrors `FixedCounter::step` and
-- `FixedCounter::refund` in src/algo/fixed.rs, in microseconds.
--
-- Parameters: W = window length (us); L = limit; unused.
-- State: "id:count", the window id (floor(t / W), windows aligned to 1970)
-- and the cost admitted in it. Absent = window 0, nothing admitted.
-- TTL: the time to the end of the state's window (then the count is stale).
--
-- A check of cost n at `now`: nid = floor(now / W); a state of an older
-- window reads as 0 in window nid; a state of the same or a later window
-- (a clock that stepped back) is evaluated in its own window, so it never
-- moves back. Allowed iff count + n <= L. A denial writes nothing.

local function fixed_step(key, now, n, W, L)
  local s = parse(redis.call('GET', key), 2) or {0, 0}
  local nid = idiv(now, W)
  local id, used = s[1], s[2]
  if nid > id then
    id, used = nid, 0
  end
  local left = (id + 1) * W - now
  local total = used + n
  if total <= L then
    local commit = function(slack)
      redis.call('SET', key, int(id) .. ':' .. int(total), 'PX', px(left, slack))
    end
    return {1, L, L - total, 0, left}, commit
  end
  return {0, L, math.max(L - used, 0), left, left}, nil
end

-- Gives back n units, only into the window they were taken from, while it
-- is the current one.
local function fixed_refund(key, now, n, W, L, unused, slack)
  local s = parse(redis.call('GET', key), 2)
  if not s or idiv(now, W) ~= s[1] or s[2] == 0 then
    return
  end
  local left = (s[1] + 1) * W - now
  redis.call('SET', key, int(s[1]) .. ':' .. int(math.max(s[2] - n, 0)), 'PX', px(left, slack))
end

