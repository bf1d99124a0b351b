-- replay: hand dead letters back to the group they died in, as fresh jobs (attempts start
-- again): each goes onto that group's retry stream, so other groups of the stream never see
-- it again, and leaves the dead-letter stream in the same step, so an interrupted replay
-- loses nothing and doubles nothing. Dead letters without original fields stay where they
-- are; one without a group (written by an older layout) goes back onto the stream itself.
-- KEYS[1] stream, KEYS[2] dead-letter stream
-- ARGV[1] retry stream prefix of the stream (from _keys.py: "<prefix>:retry:"),
-- ARGV[2] only this group's dead letters ("" for all), ARGV[3] MessagePack list of ids
-- Returns: {replayed, skipped (no original fields, unknown id or another group)}
local replayed, skipped = 0, 0
for _, id in ipairs(cmsgpack.unpack(ARGV[3])) do
  local e = redis.call('XRANGE', KEYS[2], id, id)[1]
  local f, group = {}, nil
  if e then
    for j = 1, #e[2], 2 do
      local k = e[2][j]
      if k == 'group' then group = e[2][j + 1] end
      if string.sub(k, 1, 2) == 'f.' and k ~= 'f.' .. ATTEMPTS then
        f[#f + 1] = string.sub(k, 3)
        f[#f + 1] = e[2][j + 1]
      end
    end
  end
  if #f > 0 and (ARGV[2] == '' or ARGV[2] == group) then
    local target = KEYS[1]
    if group then target = ARGV[1] .. #group .. ':' .. group end
    redis.call('XADD', target, '*', unpack(f))
    redis.call('XDEL', KEYS[2], id)
    replayed = replayed + 1
  else
    skipped = skipped + 1
  end
end
return {replayed, skipped}
