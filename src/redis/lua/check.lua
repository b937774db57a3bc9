-- One check, peek or refund of one key (the tail of every single-key
-- script; `step` and `refund` are the algorithm's, bound just above).
--
-- KEYS[1]: the key's state.
-- ARGV[1]: mode: 'c' check (take n on allow), 'p' peek (take nothing),
--          'r' refund (give back n).
-- ARGV[2]: cost n, 1 <= n <= limit (checked by the caller).
-- ARGV[3], ARGV[4], ARGV[5]: the algorithm's parameters (see its header).
-- Reply for 'c' and 'p': {allowed (0|1), limit, remaining,
--   retry_after_us, reset_after_us}, the fields of a local Decision.
-- Reply for 'r': 1.

local now = clock()
local n = tonumber(ARGV[2])
local a, b, c = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if ARGV[1] == 'r' then
  refund(KEYS[1], now, n, a, b, c)
  return 1
end
local decision, commit = step(KEYS[1], now, n, a, b, c)
if ARGV[1] == 'c' and commit then
  commit()
end
return decision
