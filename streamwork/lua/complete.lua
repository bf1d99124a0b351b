-- complete: acknowledge finished deliveries that this consumer still owns. With dedup,
-- also write the done-marker and release the job lease, but only where the lease value
-- still matches. All checks for an entry come before any write (Redis has no rollback).
-- KEYS[1]          stream
-- KEYS[2i], [2i+1] (dedup only) done-marker and lease key of entry i
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] "1" when dedup, ARGV[4] done-marker TTL (ms)
-- ARGV[5..4+n]     entry ids; with dedup ARGV[5+n..4+2n] lease values in the same order
-- Returns: one integer per entry: 1 acknowledged, 0 lost (not ours any more: nothing written)
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local dedup = ARGV[3] == '1'
local n = dedup and (#ARGV - 4) / 2 or (#ARGV - 4)
local res, acks = {}, {}
for i = 1, n do
  local id = ARGV[4 + i]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local ok = p[1] ~= nil and p[1][2] == consumer
  if ok and dedup then
    local value = ARGV[4 + n + i]
    if redis.call('GET', KEYS[2 * i + 1]) == value then
      redis.call('SET', KEYS[2 * i], value, 'PX', ARGV[4])
      redis.call('DEL', KEYS[2 * i + 1])
    else
      ok = false
    end
  end
  if ok then
    acks[#acks + 1] = id
    res[i] = 1
  else
    res[i] = 0
  end
end
if #acks > 0 then
  redis.call('XACK', stream, group, unpack(acks))
end
return res
