-- fail: end failed deliveries that this consumer still owns, in one atomic step per batch.
-- Either schedule a retry (the body goes to the delayed ZSET, due after a backoff, with its
-- attempts carried) or move the entry to the dead-letter stream with the reason and every
-- original field byte for byte. Then XACK it and release its lease, so nothing is lost or
-- doubled. An entry deleted from the stream while it was pending is dead-lettered with the
-- body the worker held in memory, reason "deleted_while_pending".
-- KEYS[1] stream, KEYS[2] delayed ZSET, KEYS[3] dead-letter stream
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] worker name, ARGV[4] lease key prefix
-- ARGV[5] MessagePack list, one per entry: [id, action ("r" retry / "d" dead), delay ms,
--         attempts so far, job key, lease value ("" none), member ("" or the adopted
--         delivery's member in the delayed ZSET), reason, error type, detail, body ("" if
--         unknown)]
-- Returns per entry: 1 retry scheduled, 2 dead-lettered, 0 lost (not ours: nothing
-- written), 4 vanished (neither the stream nor the group knows the entry any more)
local stream, delayed, dead = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, worker = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local batch = cmsgpack.unpack(ARGV[5])
local ids = {}
for i, f in ipairs(batch) do ids[i] = f[1] end
local owned = owned_ids(stream, group, consumer, ids)

local res, acks = {}, {}
for i, f in ipairs(batch) do
  local id, action, delay, attempts = f[1], f[2], f[3], f[4]
  local lock, lease, member = ARGV[4] .. f[5], f[6], f[7]
  local ok = still_held(owned, delayed, id, member)
  if ok and lease ~= '' and redis.call('GET', lock) ~= lease then
    ok = false
  end
  if not ok then
    res[i] = lost_code(stream, group, id, member)
  else
    local e = nil
    if member == '' then e = redis.call('XRANGE', stream, id, id)[1] end
    local body = f[11]
    if e then
      for j = 1, #e[2], 2 do
        if e[2][j] == BODY then body = e[2][j + 1] end
      end
    end
    if action == 'r' and e and body ~= '' then
      redis.call('ZADD', delayed, now + tonumber(delay), attempts .. ':' .. id .. ':' .. body)
      res[i] = 1
    else
      local reason = f[8]
      if not e then reason = 'deleted_while_pending' end
      local fields = {'reason', reason, 'error_type', f[9], 'detail', f[10],
                      'src_stream', stream, 'src_id', id, 'attempts', tostring(attempts),
                      'group', group, 'consumer', consumer, 'worker', worker,
                      'ts', tostring(now)}
      if e then
        for j = 1, #e[2], 2 do
          fields[#fields + 1] = 'f.' .. e[2][j]
          fields[#fields + 1] = e[2][j + 1]
        end
      elseif body ~= '' then
        fields[#fields + 1] = 'f.' .. BODY
        fields[#fields + 1] = body
      end
      redis.call('XADD', dead, '*', unpack(fields))
      res[i] = 2
    end
    if lease ~= '' then redis.call('DEL', lock) end
    if member ~= '' then
      redis.call('ZREM', delayed, member)
    else
      acks[#acks + 1] = id
    end
  end
end
if #acks > 0 then xack_all(stream, group, acks) end
return res
