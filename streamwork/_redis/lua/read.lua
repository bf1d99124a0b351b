-- read: one read round of a consumer over a stream's priority levels, in one step: new
-- entries (">") of each stream, as many in all as the consumer has room for. Each stream
-- first takes up to its count (ARGV[4 + i]; the worker computes them: in strict order the
-- room for the first stream and 0 for the others, weighted a share by deficit round robin),
-- then what room is left goes to the streams in KEYS order (the worker orders them by what
-- they are owed), so a stream with no new entries gives its share to the next.
-- A stream that exists without the group gets it, created at id 0 (a level's first job
-- arrived since the worker last looked); a stream that does not exist costs nothing.
-- KEYS: the streams, in the order left room is filled
-- ARGV[1] group, ARGV[2] consumer, ARGV[3] room (most entries in all), ARGV[4] unused
-- ("strict" or "weighted", kept for the call's shape), ARGV[4 + i] how many KEYS[i] takes
-- before the rest is filled in order
-- Returns a flat list: stream, its entries (maybe none), for each stream that exists
local group, consumer = ARGV[1], ARGV[2]
local left = tonumber(ARGV[3])

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

local exists, got = {}, {}
for i, stream in ipairs(KEYS) do
  exists[i] = redis.call('EXISTS', stream) == 1
  got[i] = {}
end

local function take(i, count)
  if count <= 0 or left <= 0 then return end
  local entries = xread(KEYS[i], math.min(count, left))
  if entries.err then error(entries.err) end
  for _, e in ipairs(entries) do got[i][#got[i] + 1] = e end
  left = left - #entries
end

for i = 1, #KEYS do  -- each stream its count
  if exists[i] then take(i, tonumber(ARGV[4 + i])) end
end
for i = 1, #KEYS do  -- what is left, in order
  if exists[i] then take(i, left) end
end

local out = {}
for i, stream in ipairs(KEYS) do
  if exists[i] then
    out[#out + 1] = stream
    out[#out + 1] = got[i]
  end
end
return out
