-- cancel: ask that a job of a group never runs, or stops. One job record, one step.
-- A job not started (queued, delayed, waiting for its retry, or not sent yet), or dead, gets
-- the record C (its deliveries are then acknowledged without running, like a done one); a
-- running one keeps its lease and gets "|C" appended to it, which the heartbeat reports to
-- its worker (msg.cancelled); a done or cancelled one is left alone.
-- KEYS[1] the job record
-- ARGV[1] reason, ARGV[2] how long the C record is kept (ms)
-- Returns the state the job was in: "unknown" (no record: queued, delayed or never sent),
-- "waiting", "dead", "running", "done" or "cancelled"
local record = redis.call('GET', KEYS[1])
local state = record and string.sub(record, 1, 1)
if state == 'D' then return 'done' end
if state == 'C' then return 'cancelled' end
if state == 'R' then
  if string.sub(record, -2) ~= '|C' then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
      redis.call('SET', KEYS[1], record .. '|C', 'PX', ttl)
    end
  end
  return 'running'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], 'C' .. cmsgpack.pack({now, ARGV[1]}), 'PX', ARGV[2])
if state == 'W' then return 'waiting' end
if state == 'X' then return 'dead' end
return 'unknown'
