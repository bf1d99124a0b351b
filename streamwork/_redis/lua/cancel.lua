-- cancel: ask that a job of a group never runs, or stops. One job record, one step.
-- A job whose handler has not started (queued in Redis or read ahead by a worker, delayed,
-- waiting for its retry, or not sent yet), or dead, gets the record C: its deliveries are
-- acknowledged without running (a worker checks the record as it starts a handler:
-- start.lua). A running one keeps its lease and gets "|C<lease deadline>|<ttl>|<reason>"
-- appended, with the record now kept for the cancel's ttl: the heartbeat tells its worker
-- (msg.cancelled), whatever its handler does next ends the job cancelled, and if its worker
-- dies the copy reclaimed elsewhere is acknowledged as cancelled. A done or cancelled job is
-- left alone.
-- KEYS[1] the job record, KEYS[2] the group's settings (a hash: "dedup" "0" when the
-- group's workers keep no job records)
-- ARGV[1] reason, ARGV[2] how long the cancellation is kept (ms)
-- Returns the state the job was in: "unknown" (no record: queued in Redis, delayed or never
-- sent), "queued" (read ahead by a worker, not started), "waiting" (a retry is due),
-- "dead", "running", "done", "cancelled", the state a job that ended without running
-- was left in ("expired", ...: nothing was done), or "ignored" (the group keeps no job
-- records: nothing was done)
if redis.call('HGET', KEYS[2], 'dedup') == '0' then return 'ignored' end
local record = redis.call('GET', KEYS[1])
local state = record and string.sub(record, 1, 1)
local now = now_ms()
if state == 'D' then return 'done' end
if state == 'C' then return 'cancelled' end
if state == 'E' then return cmsgpack.unpack(string.sub(record, 2))[3] end  -- ended (expired, ...)
if state == 'R' then
  local deadline = cancel_asked(record)
  if deadline then
    if deadline <= now then return 'cancelled' end  -- its worker died: it will not run again
    return 'running'
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('SET', KEYS[1], record .. '|C' .. (now + ttl) .. '|' .. ARGV[2] .. '|' .. ARGV[1],
               'PX', math.max(tonumber(ARGV[2]), ttl))
    return 'running'
  end
end
redis.call('SET', KEYS[1], cancelled_record(now, ARGV[1]), 'PX', ARGV[2])
if state == 'H' then
  if string.find(record, '|W', 1, true) then return 'waiting' end
  return 'queued'
end
if state == 'W' then return 'waiting' end
if state == 'X' then return 'dead' end
return 'unknown'
