-- promote: move jobs whose due time has come from the delayed ZSET back onto the stream.
-- Safe with many workers running it at once: each member is added once, then removed, in
-- one atomic step. Members are "<attempts>:<origin id>:<body>".
-- KEYS[1] delayed ZSET, KEYS[2] stream
-- ARGV[1] most members to move in this call
-- Returns: {moved, ms until the next member is due or -1 when none is left}
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, m in ipairs(due) do
  local c1 = string.find(m, ':', 1, true)
  local c2 = string.find(m, ':', c1 + 1, true)
  local attempts = string.sub(m, 1, c1 - 1)
  local body = string.sub(m, c2 + 1)
  if attempts == '0' then
    redis.call('XADD', KEYS[2], '*', BODY, body)
  else
    redis.call('XADD', KEYS[2], '*', BODY, body, ATTEMPTS, attempts)
  end
  redis.call('ZREM', KEYS[1], m)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if nxt[2] then
  wait = math.max(0, tonumber(nxt[2]) - now)
end
return {#due, wait}
