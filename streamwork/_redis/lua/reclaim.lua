-- reclaim: claim deliveries idle past the visibility timeout for this consumer, and in the
-- same atomic step record every pending entry that was deleted from the stream (which
-- XAUTOCLAIM and XCLAIM drop from the PEL) as a dead letter "deleted_while_pending", so none
-- vanishes silently. Also returns each claimed entry's delivery count (claiming increments
-- it). Two ways: from a cursor on (XAUTOCLAIM: the oldest first, whatever they are), or the
-- ids given (XCLAIM: only those, still idle past the timeout; the reclaimer picks the
-- deliveries made once out of an idle list, whatever lies between them).
-- KEYS[1] stream, KEYS[2] dead-letter stream
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] min idle (ms), ARGV[4] cursor, ARGV[5] count,
-- ARGV[6] worker name, ARGV[7..] ids (then ARGV[4] and ARGV[5] are unused)
-- Returns: {next cursor, {{id, {field, value, ...}}, ...}, {deleted id, ...}, {count, ...}}
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local r
if #ARGV > 6 then
  local ids, gone = {}, {}
  for i = 7, #ARGV do
    local id = ARGV[i]
    if redis.call('XRANGE', stream, id, id)[1] ~= nil then
      ids[#ids + 1] = id
    elseif redis.call('XPENDING', stream, group, id, id, 1)[1] ~= nil then
      gone[#gone + 1] = id  -- pending, but its entry was deleted: it can never run
    end
  end
  if #gone > 0 then redis.call('XACK', stream, group, unpack(gone)) end
  local claimed = {}
  if #ids > 0 then
    claimed = redis.call('XCLAIM', stream, group, consumer, ARGV[3], unpack(ids))
  end
  r = {'0-0', claimed, gone}
else
  r = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[3], ARGV[4], 'COUNT', ARGV[5])
end
local deleted = r[3] or {}
if #deleted > 0 then
  local now = tostring(now_ms())
  for _, id in ipairs(deleted) do
    redis.call('XADD', KEYS[2], '*', 'reason', 'deleted_while_pending', 'error_type', '',
               'detail', 'the entry was deleted or trimmed from the stream while pending',
               'src_stream', stream, 'src_id', id, 'group', group, 'consumer', consumer,
               'worker', ARGV[6], 'ts', now)
  end
end
local counts = {}
for i, e in ipairs(r[2]) do
  local p = redis.call('XPENDING', stream, group, e[1], e[1], 1)
  counts[i] = p[1] and p[1][4] or 1
end
return {r[1], r[2], deleted, counts}
