-- send: add one job to the stream, once per call. A send whose reply was lost is retried
-- with the same marker (a random token per call): finding it means the job was added, and
-- the reply is the id it got then; nothing is added again.
-- KEYS[1] stream, KEYS[2] the call's marker
-- ARGV[1] the body (the entry's 'd' field), ARGV[2] "" or N: trim the stream to about N
-- entries (XADD MAXLEN ~ N), ARGV[3] the marker's TTL in ms
-- Returns: the entry id
local seen = redis.call('GET', KEYS[2])
if seen then
  return seen
end
local id
if ARGV[2] == '' then
  id = redis.call('XADD', KEYS[1], '*', BODY, ARGV[1])
else
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', BODY, ARGV[1])
end
redis.call('SET', KEYS[2], id, 'PX', ARGV[3])
return id
