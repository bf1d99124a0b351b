-- schedule: add jobs to the delayed ZSET, due at an absolute time or after a delay measured
-- on the Redis server's clock (so producers' clock skew does not matter).
-- KEYS[1] delayed ZSET
-- ARGV[1] delay in ms ("" when ARGV[2] is used), ARGV[2] absolute due time in Unix ms,
-- ARGV[3..] members "<attempts>:<unique id>:<body>"
-- Returns: the due time in Unix ms
local due
if ARGV[1] ~= '' then
  local t = redis.call('TIME')
  due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
else
  due = tonumber(ARGV[2])
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], due, ARGV[i])
end
return due
