-- start: a worker is about to start handlers (or, "h", to put one back to wait for its
-- in-place retry): for each delivery it still owns, turn its held lease into the running
-- one, checking in the same step that the job was not cancelled and the lease is still
-- its own. Cancel and start are thus ordered by Redis: a job whose cancel came first never
-- starts; one that started first is running when the cancel comes (cancel.lua).
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] the group's retry ZSET
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] job record prefix, ARGV[4] mode: "1" the lease
-- is the job record, "2" the lease is a Redlock held elsewhere (a missing record is then
-- written anew), ARGV[5] lease TTL (ms),
-- ARGV[6] MessagePack [[entry id...], [src...], [job key...], [lease...], [member...],
--         [op ("s" start / "h" hold: wait for an in-place retry)...], [attempt...],
--         [due ms ("h")...]]
-- Cost per entry: ONE command (SET XX KEEPTTL GET) when all is well; per batch one
-- XPENDING per stream.
-- Returns per entry: 1 go (started / held), 0 lost (not ours any more: nothing written),
-- 2 cancelled (the record says cancelled now: the worker acknowledges the delivery
-- without running it), 4 vanished (neither the stream nor the group knows it)
local streams = delivery_streams()
local retries, group, consumer, prefix, mode = KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local batch = cmsgpack.unpack(ARGV[6])
local ids, srcs, jobs, leases, members = batch[1], batch[2], batch[3], batch[4], batch[5]
local ops, attempts, dues = batch[6], batch[7], batch[8]
local owned = owned_by_src(streams, group, consumer, ids, srcs)
local now = now_ms()

local res = {}
for i, id in ipairs(ids) do
  local member, src = members[i], srcs[i]
  if not still_held(owned, retries, src .. id, member) then
    res[i] = lost_code(streams[src + 1], group, id, member)
  else
    local key, lease = prefix .. jobs[i], leases[i]
    local value
    if ops[i] == 'h' then
      value = 'H' .. lease .. '|' .. attempts[i] .. '|' .. now .. '|W' .. dues[i]
    else
      value = 'R' .. lease .. '|' .. attempts[i] .. '|' .. now
    end
    local old = redis.call('SET', key, value, 'XX', 'KEEPTTL', 'GET')
    if old and leased_by(old, lease) and not cancel_asked(old) then
      res[i] = 1
    elseif not old then
      if mode == '2' then  -- the Redlock holds the lease; the record only tells
        redis.call('SET', key, value, 'PX', ARGV[5])
        res[i] = 1
      else
        res[i] = 0  -- our lease lapsed and nobody took it since
      end
    else
      local _, cancel_ttl, reason = cancel_asked(old)
      if cancel_ttl and leased_by(old, lease) then
        -- ours, cancelled while it waited for its in-place retry: it ends cancelled now
        redis.call('SET', key, cancelled_record(now, reason), 'PX', cancel_ttl)
        res[i] = 2
      else
        redis.call('SET', key, old, 'KEEPTTL')  -- not ours to change: put it back
        if string.sub(old, 1, 1) == 'C' then res[i] = 2 else res[i] = 0 end
      end
    end
  end
end
return res
