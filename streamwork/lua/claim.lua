-- claim: take the job lease for each new delivery (dedup on), in one atomic step per batch.
-- KEYS[1] stream, KEYS[2] fencing counter
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms; "0": check only, the lease is
-- taken elsewhere, e.g. from a Redlock), ARGV[4] lease owner prefix,
-- ARGV[5] done-marker key prefix "{S}:done:", ARGV[6] lease key prefix "{S}:lock:" (both
-- under the stream's hash tag, from keys.py), ARGV[7] MessagePack [[entry id...], [job key...]]
-- (one argument for the whole batch: encoding hundreds of arguments is the client's cost)
-- Returns per entry: a fencing token (> 0) when the lease was taken (its value is
-- "<owner prefix>:<token>"), -1 duplicate (done-marker exists: acknowledged, skip),
-- -2 busy (another holder has the lease: leave pending), -3 not ours (reclaimed by another),
-- 0 go ahead (check-only mode).
-- Cost per batch: one XPENDING (ownership), one INCRBY (tokens), one XACK (duplicates);
-- per entry: EXISTS done-marker, SET lease NX. Tokens are strictly increasing; a lease lost
-- to a same-key entry of the same batch leaves a gap, as fencing allows.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local batch = cmsgpack.unpack(ARGV[7])
local ids, jobs = batch[1], batch[2]
local done_prefix, lock_prefix = ARGV[5], ARGV[6]

local owned = owned_ids(stream, group, consumer, ids)

local res, dups, todo = {}, {}, {}
for i, id in ipairs(ids) do
  if not owned[id] then
    res[i] = -3
  elseif redis.call('EXISTS', done_prefix .. jobs[i]) == 1 then
    dups[#dups + 1] = id
    res[i] = -1
  elseif ARGV[3] == '0' then
    res[i] = 0
  else
    todo[#todo + 1] = i
  end
end
if #dups > 0 then xack_all(stream, group, dups) end
if #todo > 0 then
  local token = redis.call('INCRBY', KEYS[2], #todo) - #todo
  for _, i in ipairs(todo) do
    token = token + 1
    if redis.call('SET', lock_prefix .. jobs[i], ARGV[4] .. ':' .. token, 'NX', 'PX', ARGV[3]) then
      res[i] = token
    else
      res[i] = -2
    end
  end
end
return res
