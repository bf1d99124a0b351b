-- Fenced write for a resource that lives in Redis: reject writers with a stale token.
-- KEYS[1] resource key, a hash with fields 'token' (highest token seen) and 'value'
-- ARGV[1] the writer's fencing token (decimal integer), ARGV[2] the value to store
-- Returns 1 and stores {token, value} if the token is >= the highest seen (the same holder
-- may write again), else 0 and nothing changes.
local seen = redis.call('HGET', KEYS[1], 'token')
if seen and tonumber(ARGV[1]) < tonumber(seen) then
    return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return 1
