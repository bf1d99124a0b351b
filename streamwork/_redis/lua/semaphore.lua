-- semaphore: at most N holders of one concurrency key, across every worker of a group
-- (concurrency_key / concurrency_per_key). Holders are ZSET members scored by when their
-- hold lapses (Unix ms), so a crashed worker's holds lapse on their own.
-- KEYS[1] the semaphore (ZSET)
-- ARGV[1] "take" | "keep" | "give", ARGV[2] holder, ARGV[3] N, ARGV[4] hold TTL (ms)
-- Returns 1 taken / kept / given back, 0 not taken (N holders already) or not kept (lapsed)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, mode, holder = KEYS[1], ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[4])
if mode == 'give' then
  redis.call('ZREM', key, holder)
  return 1
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if mode == 'keep' then
  if redis.call('ZADD', key, 'XX', 'CH', now + ttl, holder) == 1 or
     redis.call('ZSCORE', key, holder) then
    redis.call('PEXPIRE', key, ttl)
    return 1
  end
  return 0
end
if redis.call('ZSCORE', key, holder) or redis.call('ZCARD', key) < tonumber(ARGV[3]) then
  redis.call('ZADD', key, now + ttl, holder)
  redis.call('PEXPIRE', key, ttl)
  return 1
end
return 0
