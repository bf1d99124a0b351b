-- claim: take the job lease for each new delivery (dedup on), in one atomic step per batch.
-- KEYS[1] stream, KEYS[2] fencing counter, KEYS[1+2i], KEYS[2+2i] done-marker and lease of entry i
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms; "0": check only, the lease is
-- taken elsewhere, e.g. from a Redlock), ARGV[4] lease owner prefix, ARGV[5..] entry ids
-- Returns per entry: a fencing token (> 0) when the lease was taken (its value is
-- "<owner prefix>:<token>"), -1 duplicate (done-marker exists: acknowledged, skip),
-- -2 busy (another holder has the lease: leave pending), -3 not ours (reclaimed by another),
-- 0 go ahead (check-only mode).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local res = {}
for i = 1, #ARGV - 4 do
  local id = ARGV[4 + i]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if p[1] == nil or p[1][2] ~= consumer then
    res[i] = -3
  elseif redis.call('EXISTS', KEYS[1 + 2 * i]) == 1 then
    redis.call('XACK', stream, group, id)
    res[i] = -1
  elseif ARGV[3] == '0' then
    res[i] = 0
  elseif redis.call('EXISTS', KEYS[2 + 2 * i]) == 1 then
    res[i] = -2
  else
    local token = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[2 + 2 * i], ARGV[4] .. ':' .. token, 'PX', ARGV[3])
    res[i] = token
  end
end
return res
