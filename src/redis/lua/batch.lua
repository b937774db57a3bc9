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
-- ARGV[1]: P, the number of distinct programs; ARGV[2 .. 1 + 4P]: each
--   program's algorithm ('g' GCRA, 'f' fixed window, 's' sliding window
--   counter, 'l' sliding log) and its three parameters.
-- Then '1' and three values that every call shares, or '0' and three values
--   per call i (KEYS[i] is its key; keys may repeat): its mode ('c' check,
--   'p' peek, 'r' refund), its program (1-based), cost n. (Calls of one
--   limiter, the common case, share all three: the server then parses three
--   arguments per batch instead of three per call.)
-- Reply, call after call: a GCRA check or peek (the fast path below) gets
--   one value, `held`: max(TAT - now, 0) before the call, from which the
--   client derives the decision's five fields exactly as gcra_decide would
--   (it knows the cost and the program), or its error message if it failed.
--   Any other call gets five: for 'c' and 'p' the decision fields
--   {allowed, limit, remaining, retry_after_us, reset_after_us}; for 'r'
--   {1, 0, 0, 0, 0}; for a call that failed, its error message and four 0s.
--   (One value instead of five halves the work of building and parsing the
--   reply of a batch of GCRA checks.)

local steps = {g = gcra_step, f = fixed_step, s = sliding_step, l = log_step}
local refunds = {g = gcra_refund, f = fixed_refund, s = sliding_refund, l = log_refund}
local now = clock()
local programs = {}
for p = 1, tonumber(ARGV[1]) do
  local o = 2 + 4 * (p - 1)
  programs[p] = {ARGV[o], tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])}
end
local base = 2 + 4 * #programs
local reply = {}
-- Each call's mode, program and cost; where its reply starts (`at`) and
-- whether it takes the fast path (one reply value).
local modes, calls, costs, at, fast = {}, {}, {}, {}, {}
local shared = ARGV[base] == '1'
local mode1, call1, cost1
if shared then
  mode1, call1, cost1 = ARGV[base + 1], programs[tonumber(ARGV[base + 2])], tonumber(ARGV[base + 3])
end
local next_at = 1
for i = 1, #KEYS do
  if shared then
    modes[i], calls[i], costs[i] = mode1, call1, cost1
  else
    local o = base + 1 + 3 * (i - 1)
    modes[i], calls[i], costs[i] = ARGV[o], programs[tonumber(ARGV[o + 1])], tonumber(ARGV[o + 2])
  end
  at[i] = next_at
  if calls[i][1] == 'g' and modes[i] ~= 'r' then
    fast[i] = true
    next_at = next_at + 1
  else
    next_at = next_at + 5
  end
end

-- The GCRA fast path's keys, read in one MGET: key -> its value, or false
-- if absent (or not a string).
local prefetched = {}
local fast_keys = {}
for i = 1, #KEYS do
  if fast[i] and prefetched[KEYS[i]] == nil then
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
  local o = at[i]
  reply[o], reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4] = a, b, c, d, e
end

-- A call's error message, in its first reply value.
local function fail(i, message)
  if fast[i] then
    reply[at[i]] = message
  else
    put(i, message, 0, 0, 0, 0)
  end
end

-- Writes `key`'s TAT if it changed. If the write fails, the calls that
-- took from it fail (nothing they took is stored, so none is admitted).
local function flush(key)
  if dirty[key] then
    local tat = tats[key]
    local ok, err = pcall(redis.call, 'SET', key, int(tat), 'PX', px(tat - now), 'GET')
    local g = gen[key] or 0
    if not ok then
      local message = type(err) == 'table' and err.err or tostring(err)
      for i = 1, #KEYS do
        if took[i] == g and KEYS[i] == key then
          fail(i, message)
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

-- A fast-path call whose key's TAT is known: no step can fail.
local function fast_one(i, key, mode, T, tau, n, tat)
  -- gcra_decide's test; the client derives the fields from `held`.
  local held, used, fits = gcra_fit(tat, now, n, T, tau)
  if fits and mode == 'c' then
    tats[key] = now + used
    if not dirty[key] then
      dirty[key] = true
      order[#order + 1] = key
    end
    took[i] = gen[key] or 0
  end
  reply[at[i]] = held
end

local function one(i, key, mode, program, n)
  local code, a, b, c = program[1], program[2], program[3], program[4]
  if fast[i] then
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
    fast_one(i, key, mode, a, b, n, tat)
    return
  end
  flush(key)
  if mode == 'r' then
    refunds[code](key, now, n, a, b, c)
    put(i, 1, 0, 0, 0, 0)
    return
  end
  local d, commit = steps[code](key, now, n, a, b, c)
  if mode == 'c' and commit then
    commit()
  end
  put(i, d[1], d[2], d[3], d[4], d[5])
end

for i = 1, #KEYS do
  local key = KEYS[i]
  -- A fast-path call whose TAT is at hand (changed in this batch, or read
  -- by the MGET and a number) runs without pcall: nothing in it can fail.
  -- Any other call (a key to read again, a value that is not a TAT, another
  -- algorithm) runs under pcall, so that its failure is its own.
  local tat
  if fast[i] then
    tat = tats[key]
    if tat == nil then
      local v = prefetched[key]
      if v == false then
        tat = 0
      elseif v ~= nil then
        tat = tonumber(v)
      end
      if tat ~= nil then
        tats[key] = tat
      end
    end
  end
  if tat ~= nil then
    local program = calls[i]
    fast_one(i, key, modes[i], program[2], program[3], costs[i], tat)
  else
    local ok, err = pcall(one, i, key, modes[i], calls[i], costs[i])
    if not ok then
      fail(i, type(err) == 'table' and err.err or tostring(err))
    end
  end
end
for _, key in ipairs(order) do
  flush(key)
end
return reply
