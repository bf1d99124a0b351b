-- Redlock acquire on one master: SET NX PX, and report the fencing counter.
-- KEYS[1] lock key, KEYS[2] fencing counter key (same hash tag)
-- ARGV[1] lock value (random, unique per attempt), ARGV[2] ttl in milliseconds
-- Returns {granted (1 or 0), counter as a string ("0" when absent)}. The counter is read
-- whether or not the lock was granted: the client takes the max over a quorum of masters.
local granted = 0
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    granted = 1
end
local counter = redis.call('GET', KEYS[2])
if not counter then
    counter = '0'
end
return {granted, counter}
