-- promote: move jobs whose due time has come from delayed ZSETs back onto their streams.
-- Safe with many workers running it at once: each member is added once, then removed, in
-- one atomic step. Members are "<attempts>:<origin id>:<body>". One call serves every pair
-- (a worker's delayed sends and its group's retries): an idle worker polls once, not twice.
-- KEYS[2i-1] a delayed ZSET, KEYS[2i] the stream its due members go to
-- ARGV[1] most members to move per pair in this call
-- Returns per pair: moved, ms until its next member is due or -1 when none is left
local now = now_ms()
local res = {}
for k = 1, #KEYS, 2 do
  local zset, stream = KEYS[k], KEYS[k + 1]
  local due = redis.call('ZRANGEBYSCORE', zset, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
  for _, m in ipairs(due) do
    local c1 = string.find(m, ':', 1, true)
    local c2 = string.find(m, ':', c1 + 1, true)
    local attempts = string.sub(m, 1, c1 - 1)
    local body = string.sub(m, c2 + 1)
    if attempts == '0' then
      redis.call('XADD', stream, '*', BODY, body)
    else
      redis.call('XADD', stream, '*', BODY, body, ATTEMPTS, attempts)
    end
    redis.call('ZREM', zset, m)
  end
  local nxt = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  local wait = -1
  if nxt[2] then
    wait = math.max(0, tonumber(nxt[2]) - now)
  end
  res[#res + 1] = #due
  res[#res + 1] = wait
end
return res
