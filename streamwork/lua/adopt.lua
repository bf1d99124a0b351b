-- adopt: take over deliveries whose stream entry was deleted (XDEL, a foreign XTRIM) while
-- this consumer held them. The PEL entry is acknowledged (nobody else will then record the
-- job as deleted without its payload) and the job's body, which the worker still holds, is
-- parked in the delayed ZSET due after the lease TTL: a safety net that the heartbeat keeps
-- pushing back while the handler runs. complete.lua / fail.lua remove it when the outcome
-- lands; if the worker dies first, the promoter re-enqueues the job: nothing is lost.
-- KEYS[1] stream, KEYS[2] delayed ZSET
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms),
-- ARGV[4] MessagePack [[entry id...], [member "<attempts>:<id>:<body>"...]]
-- Returns per entry: 1 adopted, 0 not ours or not deleted (left alone)
local stream, delayed, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local batch = cmsgpack.unpack(ARGV[4])
local ids, members = batch[1], batch[2]
local owned = owned_ids(stream, group, consumer, ids)
local due = now_ms() + tonumber(ARGV[3])
local res, acks = {}, {}
for i, id in ipairs(ids) do
  if owned[id] and not entry_exists(stream, id) then
    redis.call('ZADD', delayed, due, members[i])
    acks[#acks + 1] = id
    res[i] = 1
  else
    res[i] = 0
  end
end
if #acks > 0 then xack_all(stream, group, acks) end
return res
