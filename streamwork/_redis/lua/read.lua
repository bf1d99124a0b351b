-- read: one read round of a consumer over a stream's priority levels, in one step: new
-- entries (">") of each level, as many in all as the consumer has room for. "strict" takes
-- from each stream in turn what room is left (a lower level only gets what the higher ones
-- did not fill); "weighted" gives each level its share of the room by weight (at least one
-- entry: a level with jobs is never starved), shares again what some did not fill, then
-- fills what is left in order.
-- A stream that exists without the group gets it, created at id 0 (a level's first job
-- arrived since the worker last looked); a stream that does not exist costs nothing.
-- KEYS: the streams in the order they are served (the group's retry stream, high, the
-- stream itself, low)
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] room (most entries in all), ARGV[4] "strict" or
-- "weighted", ARGV[4 + i] the weight of KEYS[i] ("0": served first, before any share)
-- Returns a flat list: stream, its entries (maybe none), for each stream that exists
local group, consumer = ARGV[1], ARGV[2]
local left = tonumber(ARGV[3])
local weighted = ARGV[4] == 'weighted'

local function xread(stream, count)
  local r = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                        'STREAMS', stream, '>')
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 7) ~= 'NOGROUP' then return r end
    redis.call('XGROUP', 'CREATE', stream, group, '0')
    r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                   'STREAMS', stream, '>')
  end
  if not r then return {} end
  return r[1][2]
end

local exists, got, full = {}, {}, {}
for i, stream in ipairs(KEYS) do
  exists[i] = redis.call('EXISTS', stream) == 1
  got[i] = {}
end

local function take(i, count)
  if count <= 0 then return end
  local entries = xread(KEYS[i], count)
  if entries.err then error(entries.err) end
  for _, e in ipairs(entries) do got[i][#got[i] + 1] = e end
  full[i] = #entries == count
  left = left - #entries
end

for i = 1, #KEYS do  -- the unweighted streams first (strict: every stream, in order)
  if exists[i] and (not weighted or tonumber(ARGV[4 + i]) == 0) then take(i, left) end
end
if weighted then
  -- each level its share of the room left, by weight (at least one); what a level did not
  -- fill is shared again among those that filled theirs (they may hold more), twice more
  local eligible = {}
  for i = 1, #KEYS do
    if exists[i] and tonumber(ARGV[4 + i]) > 0 then eligible[#eligible + 1] = i end
  end
  for _ = 1, 3 do
    if left <= 0 or #eligible == 0 then break end
    local total, room, more = 0, left, {}
    for _, i in ipairs(eligible) do total = total + tonumber(ARGV[4 + i]) end
    for _, i in ipairs(eligible) do
      if left > 0 then
        take(i, math.min(left, math.max(1, math.floor(room * tonumber(ARGV[4 + i]) / total))))
        if full[i] then more[#more + 1] = i end
      end
    end
    eligible = more
  end
  for _, i in ipairs(eligible) do  -- what is still left, in order
    if left > 0 then take(i, left) end
  end
end

local out = {}
for i, stream in ipairs(KEYS) do
  if exists[i] then
    out[#out + 1] = stream
    out[#out + 1] = got[i]
  end
end
return out
