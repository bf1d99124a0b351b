-- tick: enqueue due ticks of one periodic schedule, each once across all workers. Every
-- live worker calls it for the ticks it finds due; the last-tick key says up to which tick
-- everything is decided, so a tick already enqueued (or skipped by catch_up) by another
-- worker is never enqueued again, and the XADDs and the move of that key are one step.
-- KEYS[1] the stream the jobs go to (the group's own stream: its retry stream, which only
-- that group reads), KEYS[2] the schedule's last-tick key (Unix ms)
-- ARGV[1] upto: the latest tick (Unix ms) this call decides about, ARGV[2] MessagePack list
-- of {tick ms, body} pairs to enqueue, ascending, none later than upto
-- Returns {ticks enqueued, last tick (-1: none yet), server time in Unix ms}; a call whose
-- upto is still in the future on the server's clock enqueues nothing (a worker whose
-- clock runs ahead cannot enqueue early)
local now = now_ms()
local last = tonumber(redis.call('GET', KEYS[2]) or '-1') or -1
local upto = tonumber(ARGV[1])
if upto > now or upto <= last then
  return {0, last, now}
end
local n = 0
for _, tick in ipairs(cmsgpack.unpack(ARGV[2])) do
  if tick[1] > last and tick[1] <= upto then
    redis.call('XADD', KEYS[1], '*', BODY, tick[2])
    n = n + 1
  end
end
redis.call('SET', KEYS[2], ARGV[1])
return {n, upto, now}
