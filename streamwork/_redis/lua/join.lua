-- join: open a join (a fan-in: see join_lib) or record children's ends drained from an
-- outbox (Redis Cluster), on the callback stream's slot.
-- KEYS[1] join record, KEYS[2] its results, KEYS[3] the callback stream's dead letters
-- ARGV[1] "open": ARGV[2] n children, ARGV[3] policy ("run" / "dead"), ARGV[4] the stream
-- the callback goes to, ARGV[5] its body, ARGV[6] ttl (ms). Answers 1 opened (2: and
-- fired at once: every child had reported), 0 already open with the same n (a resend of
-- the same join), or an error when the key names another join (another n).
-- ARGV[1] "report": ARGV[2] MessagePack [[child index, state, value], ...], ARGV[3] ttl
-- (ms). Answers how many were new (a report moved twice counts once).
local jkey, rkey, dead = KEYS[1], KEYS[2], KEYS[3]
if ARGV[1] == 'open' then
  local n = redis.call('HGET', jkey, 'n')
  if n then
    if n == ARGV[2] then return 0 end
    return redis.error_reply('JOINKEY the join key is in use by a join of ' .. n ..
                             ' children: give each join a key of its own')
  end
  redis.call('HSET', jkey, 'n', ARGV[2], 'policy', ARGV[3], 'to', ARGV[4], 'body', ARGV[5],
             'state', 'open', 'opened', now_ms())
  redis.call('HSETNX', jkey, 'done', 0)
  redis.call('HSETNX', jkey, 'failed', 0)
  redis.call('PEXPIRE', jkey, ARGV[6])
  if redis.call('EXISTS', rkey) == 1 then redis.call('PEXPIRE', rkey, ARGV[6]) end
  return join_fire(jkey, dead)
end
local new = 0
for _, r in ipairs(cmsgpack.unpack(ARGV[2])) do
  if join_report(jkey, rkey, dead, r[1], r[2], r[3], ARGV[3]) > 0 then new = new + 1 end
end
return new
