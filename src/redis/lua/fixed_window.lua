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

-- The state of `key` at `now`: its window id and the cost admitted in it,
-- a state of an older window read as 0 in the current one.
local function fixed_load(key, now, W)
  local s = parse(redis.call('GET', key), 2) or {0, 0}
  local nid = idiv(now, W)
  local id, used = s[1], s[2]
  if nid > id then
    id, used = nid, 0
  end
  return id, used
end

-- Writes `count` admitted in window `id`, which ends in `left` us.
local function fixed_write(key, id, count, left)
  redis.call('SET', key, int(id) .. ':' .. int(count), 'PX', px(left))
end

-- The decision and, on allow, its commit. `commit(more)` also
-- counts `more` units (a lease, lua/lease.lua) in the window. The third
-- value is the window id.
local function fixed_step(key, now, n, W, L)
  local id, used = fixed_load(key, now, W)
  local left = (id + 1) * W - now
  local total = used + n
  if total <= L then
    local commit = function(more)
      fixed_write(key, id, total + (more or 0), left)
    end
    return {1, L, L - total, 0, left}, commit, id
  end
  return {0, L, math.max(L - used, 0), left, left}, nil, id
end

-- Gives back n units, only into the window they were taken from, while it
-- is the current one.
local function fixed_refund(key, now, n, W, L, unused)
  local s = parse(redis.call('GET', key), 2)
  if not s or idiv(now, W) ~= s[1] or s[2] == 0 then
    return
  end
  fixed_write(key, s[1], math.max(s[2] - n, 0), (s[1] + 1) * W - now)
end

