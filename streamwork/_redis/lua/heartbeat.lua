-- heartbeat: keep live deliveries from being reclaimed. For each delivery this consumer still
-- owns (and, with dedup, whose job record still holds its lease), reset its idle time with
-- XCLAIM ... JUSTID (which does not count a delivery) and extend the lease. Never recreates
-- an expired lease: a lost lease stays lost. Runs under OOM too (allow-oom: it only
-- touches existing keys), so a full Redis does not make live jobs look dead.
-- An entry deleted from the stream is NOT XCLAIMed (that would silently drop it from the
-- PEL): it is reported, and the worker adopts it (adopt.lua) so its outcome still lands.
-- KEYS[1] stream, KEYS[2] the group's retry stream, KEYS[3] the group's retry ZSET
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] lease TTL (ms), ARGV[4] job record prefix,
-- ARGV[5] MessagePack [[entry id...], [src...], [job key...], [lease ("": none)...],
--         [member ("": not adopted)...], [Redlock lease the record names ("": none)...],
--         [progress to record ("": none, "=": keep the last)...]], ARGV[6] progress
--         record prefix
-- A kept delivery's new progress (msg.progress: MessagePack [fraction, note, Unix ms]) is
-- written beside its job record, the last one wins; every beat keeps it one lease TTL
-- longer while the job runs.
-- Returns per entry: 1 kept, 5 kept and its job was cancelled meanwhile (the record's lease
-- carries a cancel request: see cancel.lua; the lease deadline in it moves instead of the
-- record's TTL, which stays the cancel's), 6 kept and the record says cancelled (a job
-- cancelled before its handler started: the worker acknowledges it without running it;
-- with a Redlock, one whose record lapsed while it ran: its handler is told),
-- 0 lost (another consumer owns it, or the lease is gone),
-- 2 deleted (ours, but its entry was deleted: adopt it), 3 vanished (neither the stream
-- nor the group knows it any more: the server lost it)
local streams = delivery_streams()
local retries, group, consumer = KEYS[3], ARGV[1], ARGV[2]
local batch = cmsgpack.unpack(ARGV[5])
local ids, srcs, jobs, leases, members = batch[1], batch[2], batch[3], batch[4], batch[5]
local marks = batch[6] or {}
local progress = batch[7] or {}
local owned = owned_by_src(streams, group, consumer, ids, srcs)
local due = now_ms() + tonumber(ARGV[3])

local res = {}
for i, id in ipairs(ids) do
  local stream = streams[srcs[i] + 1]
  local key = ARGV[4] .. jobs[i]
  local record = nil
  local mark = marks[i] or ''  -- a Redlock lease: the record only tells (kept, not checked)
  if leases[i] ~= '' or mark ~= '' then record = redis.call('GET', key) end
  local lease_ok = leases[i] == '' or leased_by(record, leases[i])
  if members[i] ~= '' then
    if lease_ok and redis.call('ZSCORE', retries, members[i]) then
      redis.call('ZADD', retries, 'XX', due, members[i])
      res[i] = 1
    else
      res[i] = 0
    end
  elseif not owned[srcs[i] .. id] then
    res[i] = lost_code(stream, group, id, '') == 4 and 3 or 0
  elseif not entry_exists(stream, id) then
    res[i] = 2
  elseif record and string.sub(record, 1, 1) == 'C' then
    -- cancelled while held, before its handler started: still ours, to acknowledge
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    res[i] = 6
  elseif not lease_ok then
    res[i] = 0
  else
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    res[i] = 1
  end
  if res[i] == 1 and mark ~= '' and not leased_by(record, mark) then
    res[i] = 1  -- with a Redlock the record is not the lease: it may have lapsed, no harm
  elseif res[i] == 1 and (leases[i] ~= '' or mark ~= '') then
    local deadline = cancel_asked(record)
    if deadline then
      -- cancel asked: the record is kept for the cancel's ttl; the lease lives on in it
      local head, tail = string.match(record, '^(.-|C)%d+(|.*)$')
      redis.call('SET', key, head .. due .. tail,
                 'KEEPTTL')
      res[i] = 5
    else
      redis.call('PEXPIRE', key, ARGV[3])
    end
  end
  local p = progress[i] or ''
  if (res[i] == 1 or res[i] == 5) and p ~= '' and jobs[i] ~= '' then
    if p == '=' then  -- no new report: the last one is kept while the job runs
      redis.call('PEXPIRE', ARGV[6] .. jobs[i], ARGV[3])
    else
      redis.call('SET', ARGV[6] .. jobs[i], p, 'PX', ARGV[3])
    end
  end
end
return res
