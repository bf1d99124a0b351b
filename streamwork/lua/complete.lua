-- complete: acknowledge finished deliveries that this consumer still owns. With dedup,
-- also write the done-marker and release the job lease, but only where the lease value
-- still matches. Writes a handler staged (msg.stage) are applied in the same step, so they
-- happen exactly once with the acknowledgement. All checks for an entry come before any
-- write (Redis has no rollback).
-- KEYS[1]          stream
-- KEYS[2..]        the keys staged commands touch (same hash slot as the stream)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] "1" dedup with the lease in this Redis, "2" dedup
-- with the lease held elsewhere (Redlock: not checked here), "0" no dedup,
-- ARGV[4] done-marker TTL (ms),
-- ARGV[5] staged commands: "" or MessagePack map {entry index: [[command, [KEYS index...],
--         [arg...]], ...]}
-- ARGV[6] done-marker key prefix "{S}:done:", ARGV[7] lease key prefix "{S}:lock:",
-- ARGV[8] MessagePack [[entry id...], [job key...], [lease value...]] (keys and values
--         only with dedup): one argument for the whole batch
-- Returns: one integer per entry: 1 acknowledged, 0 lost (not ours any more: nothing
-- written), 2 acknowledged but a staged command was rejected by Redis (others applied),
-- 3 acknowledged as a duplicate (lease held elsewhere and a done-marker already existed):
-- staged writes skipped
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local dedup = ARGV[3] ~= '0'
local lease_here = ARGV[3] == '1'
local staged = {}
if ARGV[5] ~= '' then staged = cmsgpack.unpack(ARGV[5]) end
local batch = cmsgpack.unpack(ARGV[8])
local ids, jobs, leases = batch[1], batch[2], batch[3]
local n = #ids
local owned = owned_ids(stream, group, consumer, ids)

local res, acks = {}, {}
for i = 1, n do
  local id = ids[i]
  local ok = owned[id] == true
  local done, lock = nil, nil
  if dedup then done, lock = ARGV[6] .. jobs[i], ARGV[7] .. jobs[i] end
  if ok and lease_here and redis.call('GET', lock) ~= leases[i] then
    ok = false
  end
  if ok and dedup and not lease_here and redis.call('EXISTS', done) == 1 then
    res[i] = 3
    acks[#acks + 1] = id
  elseif ok then
    res[i] = 1
    for _, op in ipairs(staged[i] or {}) do
      local call = {op[1]}
      for _, k in ipairs(op[2]) do call[#call + 1] = KEYS[k] end
      for _, a in ipairs(op[3]) do call[#call + 1] = a end
      local r = redis.pcall(unpack(call))
      if type(r) == 'table' and r.err then res[i] = 2 end
    end
    if dedup then
      redis.call('SET', done, leases[i], 'PX', ARGV[4])
      if lease_here then redis.call('DEL', lock) end
    end
    acks[#acks + 1] = id
  else
    res[i] = 0
  end
end
if #acks > 0 then
  redis.call('XACK', stream, group, unpack(acks))
end
return res
