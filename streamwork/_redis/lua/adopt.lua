-- adopt: take over deliveries whose stream entry was deleted (XDEL, a foreign XTRIM) while
-- this consumer held them. The PEL entry is acknowledged (nobody else will then record the
-- job as deleted without its payload) and the job's body, which the worker still holds, is
-- parked in the group's retry ZSET due after the lease TTL: a safety net that the heartbeat
-- keeps pushing back while the handler runs. complete.lua / fail.lua remove it when the
-- outcome lands; if the worker dies first, the promoter hands the job back to this group:
-- nothing is lost.
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] the group's retry ZSET
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms),
-- ARGV[4] MessagePack [[entry id...], [src...], [member "<attempts>:<id>:<body>"...]]
-- Returns per entry: 1 adopted, 0 not ours or not deleted (left alone)
local streams = delivery_streams()
local group, consumer = ARGV[1], ARGV[2]
local batch = cmsgpack.unpack(ARGV[4])
local ids, srcs, members = batch[1], batch[2], batch[3]
local owned = owned_by_src(streams, group, consumer, ids, srcs)
local due = now_ms() + tonumber(ARGV[3])
local res, acks = {}, {}
for i, id in ipairs(ids) do
  if owned[srcs[i] .. id] and not entry_exists(streams[srcs[i] + 1], id) then
    redis.call('ZADD', KEYS[3], due, members[i])
    add_ack(acks, srcs[i], id)
    res[i] = 1
  else
    res[i] = 0
  end
end
ack_by_src(streams, group, acks)
return res
