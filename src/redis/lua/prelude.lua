-- ratewall: helpers shared by every script (each script is this prelude, one
-- algorithm file and check.lua, concatenated in src/redis/script.rs).
--
-- Numbers are Lua doubles. Every value the scripts compute is an integer
-- below 2^53 (microseconds since 1970 are about 2^50.6, and the Rust side
-- rejects policies whose spans would leave that range), so sums, differences
-- and products are exact; quotients go through idiv.

-- floor(a / b) for integers 0 <= a < 2^53, b >= 1: the double quotient can
-- round up to the next integer, so it is corrected by one step either way.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- An integer as the decimal string Redis stores. tostring() and the
-- automatic conversion of redis.call keep only 14 significant digits.
local function int(x)
  return string.format('%d', x)
end

-- The time, in microseconds: the server's TIME, so that instances with
-- skewed clocks agree. (The unit tests that tie each script to the local
-- step build the scripts with lua/test_clock.lua appended, which passes a
-- time of theirs instead; that file is never part of a production script.)
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The PX argument for a key that carries information for `us` more
-- microseconds: whole milliseconds rounded up (never shorter than needed),
-- at least 1.
local function px(us)
  return int(math.max(1, idiv(math.max(us, 0) + 999, 1000)))
end

-- Parses a state string of `count` integers joined by ':'; nil if absent.
-- Anything else in the key is an error, never a silent reset.
local function parse(v, count)
  if not v then
    return nil
  end
  local out = {}
  for part in string.gmatch(v, '[^:]+') do
    out[#out + 1] = tonumber(part)
  end
  if #out ~= count then
    error('ratewall: key holds state of another policy')
  end
  for i = 1, count do
    if out[i] == nil then
      error('ratewall: key holds state of another policy')
    end
  end
  return out
end

