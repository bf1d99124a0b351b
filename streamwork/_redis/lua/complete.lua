-- complete: record the success of finished deliveries this consumer still owns, in one
-- atomic step per batch: apply the writes their handlers staged (msg.stage), turn the job
-- record into the done record (result, dedup_window), and XACK. All checks for an entry
-- come before its writes (Redis has no rollback). Registered twice: "complete" refuses to
-- start under OOM (script flags), so staged writes, done records and acks land together
-- or not at all; "ack" (allow-oom) serves batches without dedup and without staged writes,
-- so acks, which free memory, still go through when Redis is full.
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] the group's retry ZSET (where
-- adopted deliveries are tracked), KEYS[4..] the keys staged commands touch (same slot)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] mode: "1" dedup with the lease in the job
-- record, "2" dedup with the lease held elsewhere (Redlock), "0" no dedup,
-- ARGV[4] done record TTL (ms), ARGV[5] staged commands: "" or MessagePack map
-- {entry index: [[command, [KEYS index...], [arg...]], ...]}, ARGV[6] job record prefix,
-- ARGV[7] MessagePack [[entry id...], [src...], [job key...], [lease...], [member...],
-- [done record...], [end report...]] (job keys, leases and done records only with dedup;
-- member "" or the adopted delivery's member, which then stands for ownership; end report
-- "" or a join child's, see join_lib.lua: sent with the job's end), ARGV[8] lease TTL (ms)
-- Cost per entry with the lease in the record: ONE command (SET GET), so a job costs two
-- in all with claim.lua's SET NX GET.
-- Returns per entry: 1 acknowledged, 0 lost (not ours any more: nothing written),
-- 2 acknowledged but a staged command was rejected by Redis (e.g. WRONGTYPE; the others
-- applied), 3 acknowledged as a duplicate (lease held elsewhere and the record already
-- said done: staged writes skipped), 4 vanished (neither stream nor group knows the entry),
-- 5 acknowledged as cancelled (its job was cancelled while it ran: the record says
-- cancelled, staged writes are not applied)
local streams = delivery_streams()
local retries, group, consumer = KEYS[3], ARGV[1], ARGV[2]
local dedup = ARGV[3] ~= '0'
local lease_here = ARGV[3] == '1'
local staged = {}
if ARGV[5] ~= '' then staged = cmsgpack.unpack(ARGV[5]) end
local batch = cmsgpack.unpack(ARGV[7])
local ids, srcs = batch[1], batch[2]
local jobs, leases, members, dones = batch[3] or {}, batch[4] or {}, batch[5] or {},
  batch[6] or {}
local ends = batch[7] or {}  -- end reports ("": none), see join_lib.lua
local owned = owned_by_src(streams, group, consumer, ids, srcs)

local res, acks = {}, {}
for i, id in ipairs(ids) do
  local member, src = members[i] or '', srcs[i]
  local ok = still_held(owned, retries, src .. id, member)
  local key = nil
  if dedup then key = ARGV[6] .. jobs[i] end
  local cancel_ttl, reason = nil, nil  -- set when the job was cancelled while it ran
  if ok and lease_here then
    -- ONE command checks the lease and writes the done record: SET ... GET returns what
    -- the record held. Not our lease (expired and taken, or gone): put back what was there
    -- (rare; its TTL becomes the one it would get anew) and count the delivery as lost.
    local old = redis.call('SET', key, dones[i], 'PX', ARGV[4], 'GET')
    local _, asked_ttl, why = cancel_asked(old)
    if not leased_by(old, leases[i]) then
      ok = false
      if not old then
        redis.call('DEL', key)
      elseif asked_ttl then
        redis.call('SET', key, old, 'PX', asked_ttl)
      elseif string.sub(old, 1, 1) == 'R' or string.sub(old, 1, 1) == 'H' then
        redis.call('SET', key, old, 'PX', ARGV[8])
      else
        redis.call('SET', key, old, 'PX', ARGV[4])
      end
    elseif asked_ttl then
      cancel_ttl, reason = asked_ttl, why
    end
  elseif ok and dedup then  -- the lease is a Redlock: the record only tells
    local record = redis.call('GET', key)
    local _, asked_ttl, why = cancel_asked(record)
    if is_done(record) then
      res[i] = 3
    elseif asked_ttl then
      cancel_ttl, reason = asked_ttl, why
    elseif record and string.sub(record, 1, 1) == 'C' then
      cancel_ttl, reason = tonumber(ARGV[4]), cmsgpack.unpack(string.sub(record, 2))[2]
    end
  end
  if not ok then
    res[i] = lost_code(streams[src + 1], group, id, member)
  elseif cancel_ttl then
    -- cancelled while it ran: it ends cancelled, its staged writes are not applied
    redis.call('SET', key, cancelled_record(now_ms(), reason), 'PX', cancel_ttl)
    res[i] = 5
  elseif res[i] ~= 3 then
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
    if dedup and not lease_here then redis.call('SET', key, dones[i], 'PX', ARGV[4]) end
  end
  if res[i] == 1 or res[i] == 2 then
    end_report(ends[i], 'done')
  elseif res[i] == 5 then
    end_report(ends[i], 'cancelled', reason)
  end
  if res[i] == 1 or res[i] == 2 or res[i] == 3 or res[i] == 5 then
    let_go(acks, retries, member, src, id)
  end
end
ack_by_src(streams, group, acks)
return res
