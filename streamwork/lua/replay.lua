-- replay: put dead letters back on their stream as fresh jobs (attempts start again), and
-- remove each from the dead-letter stream in the same step, so an interrupted replay loses
-- nothing and doubles nothing. Dead letters without original fields stay where they are.
-- KEYS[1] stream, KEYS[2] dead-letter stream
-- ARGV[1] MessagePack list of dead-letter entry ids
-- Returns: {replayed, skipped (no original fields or unknown id)}
local replayed, skipped = 0, 0
for _, id in ipairs(cmsgpack.unpack(ARGV[1])) do
  local e = redis.call('XRANGE', KEYS[2], id, id)[1]
  local f = {}
  if e then
    for j = 1, #e[2], 2 do
      local k = e[2][j]
      if string.sub(k, 1, 2) == 'f.' and k ~= 'f.' .. ATTEMPTS then
        f[#f + 1] = string.sub(k, 3)
        f[#f + 1] = e[2][j + 1]
      end
    end
  end
  if #f > 0 then
    redis.call('XADD', KEYS[1], '*', unpack(f))
    redis.call('XDEL', KEYS[2], id)
    replayed = replayed + 1
  else
    skipped = skipped + 1
  end
end
return {replayed, skipped}
