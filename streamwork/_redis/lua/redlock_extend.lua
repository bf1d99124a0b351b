-- Redlock extend on one master: compare-and-PEXPIRE. Never recreates an expired key.
-- KEYS[1] lock key; ARGV[1] our lock value, ARGV[2] new ttl in milliseconds
-- Returns 1 if the key still held our value and its ttl was reset, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
