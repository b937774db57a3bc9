-- Several single-key calls (checks, peeks, refunds) in one script: the calls
-- that queued on one client while earlier ones were on the wire (see
-- src/redis/batch.rs). Prepended: prelude.lua and every algorithm file.
--
-- The calls run one after the other in arrival order, each exactly as its
-- own script would (check.lua), at one time: a call of a key sees what the
-- earlier calls of that key did; a denial writes nothing; a call that fails
-- (a key holding another policy's state) is an error for that call only.
--
-- GCRA checks and peeks (the common case) take a faster path: all their
-- keys are read by one MGET (one redis.call, not one per key), each key's
-- TAT is kept in `tats` while the batch runs, and written once at the end
-- (with the TTL its own call would have set), so k checks of one hot key
-- cost one SET, not k: concurrent checks of one key coalesce. Any other
-- call of such a key writes it first. The write is `SET ... GET`, which
-- fails (and the calls that took from that key with it) if the key holds
-- something other than a string, as a GET would have: MGET reads such a
-- key as absent, so only a peek of it reports a full bucket instead of an
-- error.
--
-- ARGV[1]: '' for the server's TIME; a time in us on the test-only path.
-- ARGV[2]: P, the number of distinct programs; ARGV[3 .. 2 + 4P]: each
--   program's algorithm ('g' GCRA, 'f' fixed window, 's' sliding window
--   counter, 'l' sliding log) and its three parameters.
-- Then three values per call i (KEYS[i] is its key; keys may repeat): its
--   mode ('c' check, 'p' peek, 'r' refund), its program (1-based), cost n.
-- Reply: five values per call: for 'c' and 'p' the decision fields
--   {allowed, limit, remaining, retry_after_us, reset_after_us}; for 'r'
--   {1, 0, 0, 0, 0}; for a call that failed, its error message and four 0s.

local steps = {g = gcra_step, f = fixed_step, s = sliding_step, l = log_step}
local refunds = {g = gcra_refund, f = fixed_refund, s = sliding_refund, l = log_refund}
local now, slack = clock(ARGV[1])
local programs = {}
for p = 1, tonumber(ARGV[2]) do
  local o = 3 + 4 * (p - 1)
  programs[p] = {ARGV[o], tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])}
end
local base = 3 + 4 * #programs
local reply = {}
local modes, calls, costs = {}, {}, {}
for i = 1, #KEYS do
  local o = base + 3 * (i - 1)
  modes[i], calls[i], costs[i] = ARGV[o], programs[tonumber(ARGV[o + 1])], tonumber(ARGV[o + 2])
end

-- The GCRA fast path's keys, read in one MGET: key -> its value, or false
-- if absent (or not a string).
local prefetched = {}
local fast_keys = {}
for i = 1, #KEYS do
  if calls[i][1] == 'g' and modes[i] ~= 'r' and prefetched[KEYS[i]] == nil then
    prefetched[KEYS[i]] = false
    fast_keys[#fast_keys + 1] = KEYS[i]
  end
end
if #fast_keys > 0 then
  local values = redis.call('MGET', unpack(fast_keys))
  for j, key in ipairs(fast_keys) do
    prefetched[key] = values[j] or false
  end
end
-- GCRA keys touched on the fast path: their TAT now (`tats`); whether it
-- changed since it was last written (`dirty`), and the order in which keys
-- first changed. A call that took from a key records the key's write
-- generation (`took[i]`), so a failed write can find its takers without a
-- table per key.
local tats, dirty, order, took, gen = {}, {}, {}, {}, {}

local function put(i, a, b, c, d, e)
  local o = 5 * (i - 1)
  reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] = a, b, c, d, e
end

-- Writes `key`'s TAT if it changed. If the write fails, the calls that
-- took from it fail (nothing they took is stored, so none is admitted).
local function flush(key)
  if dirty[key] then
    local tat = tats[key]
    local ok, err = pcall(redis.call, 'SET', key, int(tat), 'PX', px(tat - now, slack), 'GET')
    local g = gen[key] or 0
    if not ok then
      local message = type(err) == 'table' and err.err or tostring(err)
      for i = 1, #KEYS do
        if took[i] == g and KEYS[i] == key then
          put(i, message, 0, 0, 0, 0)
        end
      end
    end
    dirty[key] = nil
    gen[key] = g + 1
  end
  tats[key] = nil
  -- A later fast-path call of this key reads it again.
  prefetched[key] = nil
end

local function one(i, key, mode, program, n)
  local code, a, b, c = program[1], program[2], program[3], program[4]
  if code == 'g' and mode ~= 'r' then
    local tat = tats[key]
    if tat == nil then
      local v = prefetched[key]
      if v == nil then
        tat = gcra_tat(key)
      else
        tat = gcra_parse(v)
      end
      tats[key] = tat
    end
    local allowed, limit, remaining, retry, reset, new = gcra_decide(tat, now, n, a, b, c)
    if new and mode == 'c' then
      tats[key] = new
      if not dirty[key] then
        dirty[key] = true
        order[#order + 1] = key
      end
      took[i] = gen[key] or 0
    end
    put(i, allowed, limit, remaining, retry, reset)
    return
  end
  flush(key)
  if mode == 'r' then
    refunds[code](key, now, n, a, b, c, slack)
    put(i, 1, 0, 0, 0, 0)
    return
  end
  local d, commit = steps[code](key, now, n, a, b, c)
  if mode == 'c' and commit then
    commit(slack)
  end
  put(i, d[1], d[2], d[3], d[4], d[5])
end

for i = 1, #KEYS do
  local ok, err = pcall(one, i, KEYS[i], modes[i], calls[i], costs[i])
  if not ok then
    put(i, type(err) == 'table' and err.err or tostring(err), 0, 0, 0, 0)
  end
end
for _, key in ipairs(order) do
  flush(key)
end
return reply
