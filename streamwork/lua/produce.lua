-- produce: add a batch of jobs to the stream in one atomic step (all of them or, refused
-- under OOM before the first write, none), in order. The client encodes one MessagePack
-- argument for the whole batch instead of one XADD command per job; Redis does the loop.
-- KEYS[1] stream
-- ARGV[1] MessagePack list of bodies (the 'd' field of each entry)
-- Returns: the new entry ids, in order
local ids = {}
for i, body in ipairs(cmsgpack.unpack(ARGV[1])) do
  ids[i] = redis.call('XADD', KEYS[1], '*', BODY, body)
end
return ids
