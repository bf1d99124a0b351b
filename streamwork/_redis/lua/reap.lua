-- reap: remove consumers that own no pending entries and have been idle longer than a
-- threshold. XGROUP DELCONSUMER discards a consumer's pending entries, so the pending
-- count is checked in the same atomic step. A live consumer that is removed is simply
-- recreated by its next read.
-- KEYS[1] stream
-- ARGV[1] group, ARGV[2] idle threshold (ms), ARGV[3] consumer never to remove (the caller)
-- Returns: number of consumers removed
local removed = 0
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['pending'] == 0 and info['idle'] > tonumber(ARGV[2]) and info['name'] ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
