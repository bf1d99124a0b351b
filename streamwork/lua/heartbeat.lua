-- heartbeat: keep live deliveries from being reclaimed. For each entry this consumer still
-- owns (and, with dedup, whose lease value still matches), reset its idle time with
-- XCLAIM ... JUSTID (which does not count a delivery) and extend the lease. Never recreates
-- an expired lease: a lost lease stays lost.
-- KEYS[1] stream; KEYS[1+i] (dedup only) lease key of entry i
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms), ARGV[4] "1" when dedup,
-- ARGV[5..4+n] entry ids; with dedup ARGV[5+n..4+2n] lease values
-- Returns per entry: 1 kept, 0 lost
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local dedup = ARGV[4] == '1'
local n = dedup and (#ARGV - 4) / 2 or (#ARGV - 4)
local res = {}
for i = 1, n do
  local id = ARGV[4 + i]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local ok = p[1] ~= nil and p[1][2] == consumer
  if ok and dedup then
    ok = redis.call('GET', KEYS[1 + i]) == ARGV[4 + n + i]
  end
  if ok then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    if dedup then
      redis.call('PEXPIRE', KEYS[1 + i], ARGV[3])
    end
    res[i] = 1
  else
    res[i] = 0
  end
end
return res
