-- Redlock release on one master: compare-and-delete.
-- KEYS[1] lock key; ARGV[1] our lock value
-- Returns 1 if the key held our value and was deleted, else 0 (someone else's lock is kept).
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
