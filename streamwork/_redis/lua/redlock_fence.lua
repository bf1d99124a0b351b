-- Redlock fencing counter, "set if greater" on one master (quorum max+1 compare-and-set).
-- KEYS[1] fencing counter key; ARGV[1] proposed token (a decimal integer)
-- Returns {1, proposed} if the counter was below the proposal and now holds it,
-- else {0, current} and the counter is left alone. The counter never moves backwards.
local current = redis.call('GET', KEYS[1])
if not current then
    current = '0'
end
if tonumber(ARGV[1]) > tonumber(current) then
    redis.call('SET', KEYS[1], ARGV[1])
    return {1, ARGV[1]}
end
return {0, current}
