-- claim: take the job lease for each new delivery (dedup on), in one atomic step per batch.
-- KEYS[1] stream, KEYS[2] fencing counter, KEYS[1+2i], KEYS[2+2i] done-marker and lease of entry i
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms; "0": check only, the lease is
-- taken elsewhere, e.g. from a Redlock), ARGV[4] lease owner prefix, ARGV[5..] entry ids
-- Returns per entry: a fencing token (> 0) when the lease was taken (its value is
-- "<owner prefix>:<token>"), -1 duplicate (done-marker exists: acknowledged, skip),
-- -2 busy (another holder has the lease: leave pending), -3 not ours (reclaimed by another),
-- 0 go ahead (check-only mode).
-- Cost per batch: one XPENDING (ownership), one INCRBY (tokens), one XACK (duplicates);
-- per entry: EXISTS done-marker, SET lease NX. Tokens are strictly increasing; a lease lost
-- to a same-key entry of the same batch leaves a gap, as fencing allows.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local ids = {}
for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end

local owned = owned_ids(stream, group, consumer, ids)

local res, dups, todo = {}, {}, {}
for i, id in ipairs(ids) do
  if not owned[id] then
    res[i] = -3
  elseif redis.call('EXISTS', KEYS[1 + 2 * i]) == 1 then
    dups[#dups + 1] = id
    res[i] = -1
  elseif ARGV[3] == '0' then
    res[i] = 0
  else
    todo[#todo + 1] = i
  end
end
if #dups > 0 then redis.call('XACK', stream, group, unpack(dups)) end
if #todo > 0 then
  local token = redis.call('INCRBY', KEYS[2], #todo) - #todo
  for _, i in ipairs(todo) do
    token = token + 1
    if redis.call('SET', KEYS[2 + 2 * i], ARGV[4] .. ':' .. token, 'NX', 'PX', ARGV[3]) then
      res[i] = token
    else
      res[i] = -2
    end
  end
end
return res
