-- fail: end a failed delivery that this consumer still owns. Either schedule a retry (the
-- entry's body goes to the delayed ZSET, due after a backoff, with its attempts carried) or
-- move it to the dead-letter stream with the reason and every original field byte for byte.
-- Then XACK it and release its lease, all in one step so nothing is lost or doubled.
-- KEYS[1] stream, KEYS[2] delayed ZSET, KEYS[3] dead-letter stream,
-- KEYS[3+i] lease key of entry i (any key under the same tag when the entry has no lease)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] worker name
-- then 8 values per entry: id, action ("r" retry / "d" dead), delay ms, attempts so far,
-- lease value ("" for none), reason, error type, detail (message + short traceback)
-- Returns per entry: 1 retry scheduled, 2 dead-lettered, 0 lost (not ours: nothing written)
local stream, delayed, dead = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, worker = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local res = {}
local n = (#ARGV - 3) / 8
for i = 1, n do
  local b = 3 + (i - 1) * 8
  local id, action, delay, attempts = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local value = ARGV[b + 5]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local ok = p[1] ~= nil and p[1][2] == consumer
  if ok and value ~= '' and redis.call('GET', KEYS[3 + i]) ~= value then
    ok = false
  end
  if not ok then
    res[i] = 0
  else
    local e = redis.call('XRANGE', stream, id, id)[1]
    local body = nil
    if e then
      for j = 1, #e[2], 2 do
        if e[2][j] == 'd' then body = e[2][j + 1] end
      end
    end
    if action == 'r' and body then
      redis.call('ZADD', delayed, now + tonumber(delay), attempts .. ':' .. id .. ':' .. body)
      res[i] = 1
    else
      local reason = ARGV[b + 6]
      if not e then reason = 'deleted_while_pending' end
      local f = {'reason', reason, 'error_type', ARGV[b + 7], 'detail', ARGV[b + 8],
                 'src_stream', stream, 'src_id', id, 'attempts', attempts, 'group', group,
                 'consumer', consumer, 'worker', worker, 'ts', tostring(now)}
      if e then
        for j = 1, #e[2], 2 do
          f[#f + 1] = 'f.' .. e[2][j]
          f[#f + 1] = e[2][j + 1]
        end
      end
      redis.call('XADD', dead, '*', unpack(f))
      res[i] = 2
    end
    if value ~= '' then
      redis.call('DEL', KEYS[3 + i])
    end
    redis.call('XACK', stream, group, id)
  end
end
return res
