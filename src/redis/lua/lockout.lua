-- Several limits checked all or nothing, with lockouts (the HTTP layer's
-- `block_for`): multi.lua's protocol, and a block key per limit.
-- Prepended: prelude.lua and every algorithm file.
--
-- KEYS[1..k]: the limits' states (distinct keys); KEYS[k+1..2k]: each
--   limit's block key, holding the block's end (us since 1970) and expiring
--   at that end (PX).
-- ARGV[1 + 6*(i-1) .. 6 + 6*(i-1)]: limit i's algorithm ('g', 'f', 's',
--   'l' as in multi.lua), cost n (>= 1), its three parameters, and its
--   block length in us (0: no lockout).
-- Reply: {all_allowed (0|1), then for each limit its five decision fields
--   allowed, limit, remaining, retry_after_us, reset_after_us}.
--
-- Every limit is decided at one time. A limit whose key is blocked denies
-- with remaining 0 until the block's end (or its own wait, if longer), and
-- nothing is written at all (a blocked request takes nothing from any
-- limit). Otherwise, as multi.lua: if all allow, every limit takes its
-- cost; if any denies, nothing is taken, and each denying limit with a
-- lockout starts its block now (its reply then says: denied until the
-- block's end, or its own wait if longer). So a reply's retry_after never
-- names a time at which the same request is still denied.

local steps = {g = gcra_step, f = fixed_step, s = sliding_step, l = log_step}
local now = clock()
local k = #KEYS / 2
local reply = {1}
local commits = {}
local blocked = false
for i = 1, k do
  local o = 1 + 6 * (i - 1)
  local d, commit = steps[ARGV[o]](KEYS[i], now, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]),
    tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]))
  commits[i] = commit
  if tonumber(ARGV[o + 5]) > 0 then
    local ends = redis.call('GET', KEYS[k + i])
    local left = ends and (tonumber(ends) - now) or 0
    if left > 0 then
      -- Denied until the block's end, or the limit's own wait if longer:
      -- a client that obeys must find both over.
      if d[1] == 0 and d[4] > left then
        left = d[4]
      end
      d = {0, d[2], 0, left, left}
      blocked = true
    end
  end
  if d[1] == 0 then
    reply[1] = 0
  end
  for j = 1, 5 do
    reply[#reply + 1] = d[j]
  end
end
if reply[1] == 1 then
  for i = 1, k do
    commits[i]()
  end
elseif not blocked then
  for i = 1, k do
    local block = tonumber(ARGV[6 * i])
    local at = 2 + 5 * (i - 1)
    if block > 0 and reply[at] == 0 then
      redis.call('SET', KEYS[k + i], int(now + block), 'PX', px(block))
      local wait = math.max(block, reply[at + 3])
      reply[at + 2], reply[at + 3], reply[at + 4] = 0, wait, wait
    end
  end
end
return reply
