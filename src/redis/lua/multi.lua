-- Several limits checked all or nothing in one script (keys that live on
-- one server, or one Cluster slot). Prepended: prelude.lua and every
-- algorithm file. Mirrors the local check_all: every limit is decided at
-- one time; if all allow, every limit takes its cost; if any denies,
-- nothing is written at all.
--
-- KEYS[1..k]: the limits' states (distinct keys).
-- ARGV[1 + 5*(i-1) .. 5 + 5*(i-1)]: limit i's algorithm ('g' GCRA,
--   'f' fixed window, 's' sliding window counter, 'l' sliding log), cost n
--   (>= 1), and its three parameters.
-- Reply: {all_allowed (0|1), then for each limit its five decision fields
--   allowed, limit, remaining, retry_after_us, reset_after_us}.

local steps = {g = gcra_step, f = fixed_step, s = sliding_step, l = log_step}
local now = clock()
local reply = {1}
local commits = {}
for i = 1, #KEYS do
  local o = 1 + 5 * (i - 1)
  local step = steps[ARGV[o]]
  local d, commit = step(KEYS[i], now, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]),
    tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]))
  if d[1] == 0 then
    reply[1] = 0
  end
  commits[i] = commit
  for j = 1, 5 do
    reply[#reply + 1] = d[j]
  end
end
if reply[1] == 1 then
  for i = 1, #KEYS do
    commits[i]()
  end
end
return reply
