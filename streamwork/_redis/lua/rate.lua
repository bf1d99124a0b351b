-- rate: a token bucket shared by every worker of a group (rate_limit), one step per job.
-- KEYS[1] the bucket (hash: tokens, ts)
-- ARGV[1] tokens added per ms, ARGV[2] capacity (burst)
-- Returns 0 when a token was taken (the job may start), else the ms until one is due.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(math.max(now, ts)))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 60000)
return wait
