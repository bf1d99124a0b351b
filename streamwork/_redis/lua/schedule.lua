-- schedule: add jobs to the delayed ZSET, due at an absolute time or after a delay measured
-- on the Redis server's clock (so producers' clock skew does not matter).
-- KEYS[1] delayed ZSET, KEYS[2] (optional) the send's marker (as in produce.lua: found,
-- the jobs were added by an earlier call whose reply was lost: nothing is added again)
-- ARGV[1] delay in ms ("" when ARGV[2] is used), ARGV[2] absolute due time in Unix ms,
-- ARGV[3] MessagePack list of members "<attempts>:<unique id>:<body>", ARGV[4] the
-- marker's TTL in ms
-- Returns: the due time in Unix ms (the first call's, for a repeated one)
if KEYS[2] then
  local seen = redis.call('GET', KEYS[2])
  if seen then
    return tonumber(seen)
  end
end
local due
if ARGV[1] ~= '' then
  due = now_ms() + tonumber(ARGV[1])
else
  due = tonumber(ARGV[2])
end
for _, member in ipairs(cmsgpack.unpack(ARGV[3])) do
  redis.call('ZADD', KEYS[1], due, member)
end
if KEYS[2] then
  redis.call('SET', KEYS[2], due, 'PX', ARGV[4])
end
return due
