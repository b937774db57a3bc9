-- Test only: appended to lua/prelude.lua in the scripts of the crate's unit
-- tests (src/redis/script.rs, under cfg(test)); never part of a production
-- script. It replaces `clock` and `px` for the rest of the script.
--
-- ARGV[#ARGV] (the last argument, which every call of a test build adds):
-- '' for the server's TIME, or a time in us that the test chose (the
-- differential tests run each script at the times they run the local step).
-- A script run at a chosen time gives every TTL 60 s of slack, because the
-- key still expires on the server's real clock while the test moves its
-- own time.

local test_now = ARGV[#ARGV]
local server_clock = clock

local function clock()
  if test_now ~= '' then
    return tonumber(test_now)
  end
  return server_clock()
end

local function px(us)
  local ms = math.max(1, idiv(math.max(us, 0) + 999, 1000))
  if test_now ~= '' then
    ms = ms + 60000
  end
  return int(ms)
end
