-- produce: add a batch of jobs to the stream in one atomic step (all of them or, refused
-- under OOM before the first write, none), in order. The client encodes one MessagePack
-- argument for the whole batch instead of one XADD command per job; Redis does the loop.
-- KEYS[1] stream
-- KEYS[2] (optional) the send's marker: a send whose reply was lost is retried with the
-- same marker, and finding it means the jobs were stored: they are not added again, and
-- the reply is the one the first call gave
-- ARGV[1] MessagePack list of bodies (the 'd' field of each entry), ARGV[2] "" or N: trim
-- the stream to about N entries (XADD MAXLEN ~ N), ARGV[3] the marker's TTL in ms
-- Returns: {first id, count} when the ids are first's millisecond with consecutive
-- sequence numbers (the usual case: a script's clock stands still), else every id, in order
local marker = KEYS[2]
if marker then
  local seen = redis.call('GET', marker)
  if seen then
    return cmsgpack.unpack(seen)
  end
end
local function stored(reply)
  if marker then
    redis.call('SET', marker, cmsgpack.pack(reply), 'PX', ARGV[3])
  end
  return reply
end
local ids = {}
local stream = KEYS[1]
if ARGV[2] == '' then
  for i, body in ipairs(cmsgpack.unpack(ARGV[1])) do
    ids[i] = redis.call('XADD', stream, '*', BODY, body)
  end
else
  for i, body in ipairs(cmsgpack.unpack(ARGV[1])) do
    ids[i] = redis.call('XADD', stream, 'MAXLEN', '~', ARGV[2], '*', BODY, body)
  end
end
local n = #ids
if n < 2 then
  return stored(ids)
end
local ms1, seq1 = string.match(ids[1], '^(%d+)%-(%d+)$')
local msn, seqn = string.match(ids[n], '^(%d+)%-(%d+)$')
-- sequence numbers past 2^52 would lose digits as Lua numbers: send every id then
if ms1 == msn and #seqn < 16 and tonumber(seqn) - tonumber(seq1) == n - 1 then
  return stored({ids[1], n})
end
return stored(ids)
