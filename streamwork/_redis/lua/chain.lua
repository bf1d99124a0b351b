-- chain: move jobs from a source stream's outbox (Redis Cluster: jobs handlers sent to a
-- stream in another slot) onto their target, once. The target keeps the last outbox entry
-- id it took from that source (the chained mark), and an entry at or below it was moved
-- before (by a drainer that died before deleting it, or by another worker at the same
-- time): it is skipped. Entries of one source come in id order, so the mark only rises.
-- KEYS[1] the target's chained mark for this source, KEYS[2] target stream, KEYS[3] the
-- target's delayed ZSET
-- ARGV[1] MessagePack list of [outbox entry id, body, maxlen or "", due Unix ms or ""],
-- in id order
-- Returns: {added, skipped}, or an error after adding those before the failing entry
-- (the mark says how far it got)
local function after(a, b)  -- is stream id a past b (nil: nothing moved yet)?
  if not b then return true end
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am > bm end
  return tonumber(as) > tonumber(bs)
end
local mark = redis.call('GET', KEYS[1])
local added, skipped = 0, 0
for _, e in ipairs(cmsgpack.unpack(ARGV[1])) do
  if after(e[1], mark) then
    local r
    if e[4] ~= '' then
      r = redis.pcall('ZADD', KEYS[3], tonumber(e[4]), e[2])
    elseif e[3] ~= '' then
      r = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', e[3], '*', BODY, e[2])
    else
      r = redis.pcall('XADD', KEYS[2], '*', BODY, e[2])
    end
    if type(r) == 'table' and r.err then
      if added > 0 then redis.call('SET', KEYS[1], mark) end
      return redis.error_reply(r.err)
    end
    mark = e[1]
    added = added + 1
  else
    skipped = skipped + 1
  end
end
if added > 0 then redis.call('SET', KEYS[1], mark) end
return {added, skipped}
