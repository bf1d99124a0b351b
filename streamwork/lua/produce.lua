-- produce: add a batch of jobs to the stream in one atomic step (all of them or, refused
-- under OOM before the first write, none), in order. The client encodes one MessagePack
-- argument for the whole batch instead of one XADD command per job; Redis does the loop.
-- KEYS[1] stream
-- ARGV[1] MessagePack list of bodies (the 'd' field of each entry), ARGV[2] "" or N: trim
-- the stream to about N entries (XADD MAXLEN ~ N)
-- Returns: the new entry ids, in order
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
return ids
