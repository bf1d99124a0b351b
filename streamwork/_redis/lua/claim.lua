-- claim: take the job records of a batch of new deliveries (dedup on), one atomic step.
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] fencing counter, KEYS[4..] the
-- keys the end reports write
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms), ARGV[4] lease owner prefix,
-- ARGV[5] job record prefix of the group (from _keys.py), ARGV[6] mode: "lease" (take the
-- record as this consumer's lease), "check" (only look: the lease is taken elsewhere, a
-- Redlock), "mark" (the Redlock lease is held: write the held record unless done),
-- ARGV[7] MessagePack [[entry id...], [src...], [job key...], [attempt...], [lease...],
-- [start...], [report...]] (leases: the Redlock leases held, in "mark" mode; start, optional, "lease"
-- mode: 1 when a runner is idle for it, so its record is taken as the running one at once,
-- as start.lua would make it right after)
-- Returns per entry: a fencing token (> 0) when the record was taken (its value is the held
-- lease "H<owner prefix>:<token>|<attempt>|<now>": start.lua turns it into the running one
-- when the handler starts), -1 duplicate (the record says done: acknowledged, skip),
-- -2 busy (another holder has it: keep waiting), -3 not ours (reclaimed by another),
-- -4 cancelled (the record says cancelled, or cancel-requested while another copy runs:
-- acknowledged, skip), 0 go ahead ("check" mode). A duplicate or cancelled job's end
-- report (batch[7], see join_lib.lua) is written as it is acknowledged.
-- Cost per entry in "lease" mode: ONE command (SET NX GET: it takes a free record and
-- shows a taken one); a waiting or dead record, which never blocks a later copy, costs a
-- second SET. Per batch: one XPENDING per stream read, one INCRBY, one XACK (duplicates).
local streams = delivery_streams()
local group, consumer, ttl, owner, prefix, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4],
  ARGV[5], ARGV[6]
local batch = cmsgpack.unpack(ARGV[7])
local ids, srcs, jobs, attempts, leases = batch[1], batch[2], batch[3], batch[4], batch[5]
local starts = batch[6] or {}
local reports = batch[7] or {}  -- end reports ("": none, see join_lib.lua)
local owned = owned_by_src(streams, group, consumer, ids, srcs)
local now = now_ms()

-- a record that says cancelled (C), or a running one whose cancel was asked (its handler
-- ends it cancelled; if its lease lapsed, its worker died: the record becomes C now)
local function cancelled(key, record, state)
  if state == 'C' then return true end
  local deadline, cancel_ttl, reason = cancel_asked(record)
  if not deadline then return false end
  if deadline <= now then redis.call('SET', key, cancelled_record(now, reason), 'PX', cancel_ttl) end
  return true
end

local res, acks, todo = {}, {}, {}
for i, id in ipairs(ids) do
  if not owned[srcs[i] .. id] then
    res[i] = -3
  elseif mode == 'lease' then
    todo[#todo + 1] = i
  else
    local record = redis.call('GET', prefix .. jobs[i])
    local state = record and string.sub(record, 1, 1)
    if state == 'D' then
      res[i] = -1
      end_report(reports[i], 'done', nil, record)
      add_ack(acks, srcs[i], id)
    elseif cancelled(prefix .. jobs[i], record, state) then
      res[i] = -4
      end_report(reports[i], 'cancelled', 'cancelled before it started')
      add_ack(acks, srcs[i], id)
    else
      res[i] = 0
      if mode == 'mark' then
        redis.call('SET', prefix .. jobs[i], 'H' .. leases[i] .. '|' .. attempts[i] .. '|' .. now,
                   'PX', ttl)
      end
    end
  end
end
if #todo > 0 then
  local token = redis.call('INCRBY', KEYS[3], #todo) - #todo
  for _, i in ipairs(todo) do
    token = token + 1
    local key = prefix .. jobs[i]
    local state = starts[i] == 1 and 'R' or 'H'
    local value = state .. owner .. ':' .. token .. '|' .. attempts[i] .. '|' .. now
    local ok, old = pcall(redis.call, 'SET', key, value, 'NX', 'PX', ttl, 'GET')
    if not ok then  -- a server without SET NX GET (before 7.0): two commands
      old = redis.call('GET', key)
      if not old then redis.call('SET', key, value, 'PX', ttl) end
    end
    local state = old and string.sub(old, 1, 1)
    if not old then
      res[i] = token
    elseif state == 'D' then
      res[i] = -1
      end_report(reports[i], 'done', nil, old)
      add_ack(acks, srcs[i], ids[i])
    elseif cancelled(key, old, state) then
      res[i] = -4
      end_report(reports[i], 'cancelled', 'cancelled before it started')
      add_ack(acks, srcs[i], ids[i])
    elseif state == 'R' or state == 'H' then
      res[i] = -2
    else  -- waiting or dead: a later copy may run
      redis.call('SET', key, value, 'PX', ttl)
      res[i] = token
    end
  end
end
ack_by_src(streams, group, acks)
return res
