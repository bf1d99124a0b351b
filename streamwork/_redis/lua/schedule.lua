-- schedule: add jobs to the delayed ZSET, due at an absolute time or after a delay measured
-- on the Redis server's clock (so producers' clock skew does not matter).
-- KEYS[1] delayed ZSET
-- ARGV[1] delay in ms ("" when ARGV[2] is used), ARGV[2] absolute due time in Unix ms,
-- ARGV[3] MessagePack list of members "<attempts>:<unique id>:<body>"
-- Returns: the due time in Unix ms
local due
if ARGV[1] ~= '' then
  due = now_ms() + tonumber(ARGV[1])
else
  due = tonumber(ARGV[2])
end
for _, member in ipairs(cmsgpack.unpack(ARGV[3])) do
  redis.call('ZADD', KEYS[1], due, member)
end
return due
