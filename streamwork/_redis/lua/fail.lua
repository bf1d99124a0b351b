-- fail: end failed deliveries that this consumer still owns, in one atomic step per batch.
-- Either schedule a retry for this group only (the body goes to the group's retry ZSET, due
-- after a backoff, with its attempts carried) or move the entry to the dead-letter stream
-- with the reason and every original field byte for byte. With dedup the job record then
-- says waiting (due, attempts, error) or dead (reason, dead-letter id): neither blocks a
-- later copy of the key from running. Then XACK, all in one step, so nothing is lost or
-- doubled. An entry deleted from the stream while pending is dead-lettered with the body
-- the worker held in memory, reason "deleted_while_pending".
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] the group's retry ZSET,
-- KEYS[4] dead-letter stream
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] worker name, ARGV[4] job record prefix,
-- ARGV[5] "1" the lease is the job record (check it), "2" dedup with the lease elsewhere,
-- "0" no dedup (no record), ARGV[6] how long a dead record is kept (ms)
-- ARGV[7] MessagePack list, one per entry: [id, src, action ("r" retry / "d" dead), delay
-- ms, attempts so far, job key, lease ("" when the delivery never held one), member ("" or the adopted delivery's member), reason,
-- error type, detail (message + short traceback), body ("" if unknown), the error the job
-- record keeps (whole lines, the cut marked), end report ("" or a join child's, sent with
-- its end unless it is retried: see join_lib.lua)]
-- ("c": cancelled while it ran - acknowledged, the record says cancelled, no dead letter;
-- "e": ended without running, as a feature decided - acknowledged, the record is
-- "E" + MessagePack [attempts, updated ms, state (the reason field), why (the detail)])
-- Returns per entry: 1 retry scheduled, 2 dead-lettered, 3 cancelled, 0 lost (not ours:
-- nothing written), 4 vanished (neither the stream nor the group knows the entry any more),
-- 5 ended without running ("e")
local streams = delivery_streams()
local retries, dead = KEYS[3], KEYS[4]
local group, consumer, worker, prefix, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
local batch = cmsgpack.unpack(ARGV[7])
local ids, srcs = {}, {}
for i, f in ipairs(batch) do ids[i], srcs[i] = f[1], f[2] end
local owned = owned_by_src(streams, group, consumer, ids, srcs)

local res, acks = {}, {}
for i, f in ipairs(batch) do
  local id, src, action, delay, attempts = f[1], f[2], f[3], f[4], f[5]
  local key, lease, member = prefix .. f[6], f[7], f[8]
  local stream = streams[src + 1]
  local ok = still_held(owned, retries, src .. id, member)
  local record = nil
  if mode ~= '0' and f[6] ~= '' then record = redis.call('GET', key) end
  if ok and mode == '1' and lease ~= '' and not leased_by(record, lease) then
    ok = false
  end
  -- cancelled while it ran (or, with a Redlock, meanwhile): whatever it raised, it ends
  -- cancelled, with no retry and no dead letter
  local _, cancel_ttl, why = cancel_asked(record)
  if not cancel_ttl and mode == '2' and lease ~= '' and record
      and string.sub(record, 1, 1) == 'C' then
    cancel_ttl, why = tonumber(ARGV[6]), cmsgpack.unpack(string.sub(record, 2))[2]
  end
  if cancel_ttl and lease ~= '' then action = 'c' end
  -- the record may say waiting / dead only if it is ours, or nobody runs or finished the job
  local state = record and string.sub(record, 1, 1)
  local write = mode ~= '0' and f[6] ~= '' and
    (lease ~= '' or not record or state == 'W' or state == 'X' or state == 'E')
  if not ok then
    res[i] = lost_code(stream, group, id, member)
  else
    local e = nil
    if member == '' then e = redis.call('XRANGE', stream, id, id)[1] end
    local body = f[12]
    if e then
      for j = 1, #e[2], 2 do
        if e[2][j] == BODY then body = e[2][j + 1] end
      end
    end
    local error_text = f[13] or (f[10] .. ': ' .. string.sub(f[11], 1, 200))
    if action == 'c' then  -- cancelled while it ran: acknowledged, the record says so
      if write then
        redis.call('SET', key, cancelled_record(now, why or f[9]), 'PX', cancel_ttl or ARGV[6])
      end
      end_report(f[14], 'cancelled', why or f[9])
      res[i] = 3
    elseif action == 'e' then  -- ended without running: acknowledged, the record says why
      if write then
        redis.call('SET', key, 'E' .. cmsgpack.pack({attempts, now, f[9], f[11]}), 'PX', ARGV[6])
      end
      end_report(f[14], f[9], f[11])
      res[i] = 5
    elseif action == 'r' and e and body ~= '' then
      local due = now + tonumber(delay)
      redis.call('ZADD', retries, due, attempts .. ':' .. src .. id .. ':' .. body)
      if write then
        redis.call('SET', key, 'W' .. cmsgpack.pack({attempts, now, due, error_text}),
                   'PX', tonumber(delay) + tonumber(ARGV[6]))
      end
      res[i] = 1
    else
      local reason = f[9]
      if not e then reason = 'deleted_while_pending' end
      local fields = {'reason', reason, 'error_type', f[10], 'detail', f[11],
                      'src_stream', KEYS[1], 'src_id', id, 'attempts', tostring(attempts),
                      'group', group, 'consumer', consumer, 'worker', worker,
                      'ts', tostring(now)}
      if src == 1 then fields[#fields + 1] = 'src_retry'; fields[#fields + 1] = '1' end
      if e then
        for j = 1, #e[2], 2 do
          fields[#fields + 1] = 'f.' .. e[2][j]
          fields[#fields + 1] = e[2][j + 1]
        end
      elseif body ~= '' then
        fields[#fields + 1] = 'f.' .. BODY
        fields[#fields + 1] = body
      end
      local dead_id = redis.call('XADD', dead, '*', unpack(fields))
      if write then
        redis.call('SET', key, 'X' .. cmsgpack.pack({attempts, now, dead_id, reason, error_text}),
                   'PX', ARGV[6])
      end
      end_report(f[14], 'dead', reason .. ': ' .. error_text)
      res[i] = 2
    end
    let_go(acks, retries, member, src, id)
  end
end
ack_by_src(streams, group, acks)
return res
