-- complete: record the success of finished deliveries that this consumer still owns, in one
-- atomic step per batch: apply the writes their handlers staged (msg.stage), with dedup turn
-- the job lease into the done-marker, and XACK. All checks for an entry come before any of
-- its writes (Redis has no rollback). Registered twice: "complete" refuses to start under
-- OOM (script flags), so staged writes, done-markers and acks land all together or not at
-- all; "ack" (allow-oom) serves batches without dedup and without staged writes, so acks,
-- which free memory, still go through when Redis is full.
-- KEYS[1] stream, KEYS[2] delayed ZSET (where adopted deliveries are tracked)
-- KEYS[3..] the keys staged commands touch (same hash slot as the stream)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] "1" dedup with the lease in this Redis, "2" dedup
-- with the lease held elsewhere (Redlock: not checked here), "0" no dedup,
-- ARGV[4] done-marker TTL (ms),
-- ARGV[5] staged commands: "" or MessagePack map {entry index: [[command, [KEYS index...],
--         [arg...]], ...]}
-- ARGV[6] done-marker key prefix "{S}:done:", ARGV[7] lease key prefix "{S}:lock:",
-- ARGV[8] MessagePack [[entry id...], [job key...], [lease value...], [member...]]: one
--         argument for the whole batch; job keys and leases only with dedup; member is ""
--         or, for a delivery adopted after its entry was deleted (adopt.lua), its member in
--         the delayed ZSET, which then stands for ownership
-- Returns per entry: 1 acknowledged, 0 lost (not ours any more: nothing written),
-- 2 acknowledged but a staged command was rejected by Redis (e.g. WRONGTYPE; the others
-- applied), 3 acknowledged as a duplicate (lease held elsewhere and a done-marker already
-- existed: staged writes skipped), 4 vanished (neither the stream nor the group knows the
-- entry any more: the server lost it)
local stream, delayed, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local dedup = ARGV[3] ~= '0'
local lease_here = ARGV[3] == '1'
local staged = {}
if ARGV[5] ~= '' then staged = cmsgpack.unpack(ARGV[5]) end
local batch = cmsgpack.unpack(ARGV[8])
local ids, jobs, leases, members = batch[1], batch[2] or {}, batch[3] or {}, batch[4] or {}
local owned = owned_ids(stream, group, consumer, ids)

local res, acks = {}, {}
for i, id in ipairs(ids) do
  local member = members[i] or ''
  local ok = still_held(owned, delayed, id, member)
  local done, lock = nil, nil
  if dedup then done, lock = ARGV[6] .. jobs[i], ARGV[7] .. jobs[i] end
  if ok and lease_here and redis.call('GET', lock) ~= leases[i] then
    ok = false
  end
  if not ok then
    res[i] = lost_code(stream, group, id, member)
  elseif dedup and not lease_here and redis.call('EXISTS', done) == 1 then
    res[i] = 3
  else
    res[i] = 1
    for _, op in ipairs(staged[i] or {}) do
      local call = {op[1]}
      for _, k in ipairs(op[2]) do call[#call + 1] = KEYS[k] end
      for _, a in ipairs(op[3]) do call[#call + 1] = a end
      local r = redis.pcall(unpack(call))
      if type(r) == 'table' and r.err then
        -- refused for lack of memory: only possible before this script wrote anything
        -- (servers without script flags), so failing now leaves no partial effect
        if string.sub(r.err, 1, 3) == 'OOM' then return redis.error_reply(r.err) end
        res[i] = 2
      end
    end
    if dedup then
      redis.call('SET', done, leases[i], 'PX', ARGV[4])
      if lease_here then redis.call('DEL', lock) end
    end
  end
  if res[i] == 1 or res[i] == 2 or res[i] == 3 then
    if member ~= '' then
      redis.call('ZREM', delayed, member)
    else
      acks[#acks + 1] = id
    end
  end
end
if #acks > 0 then xack_all(stream, group, acks) end
return res
