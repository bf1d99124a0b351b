-- joins (fan-in): a join is N child jobs and one callback job, enqueued once, when the last
-- child ended. Its keys share the callback stream's hash tag: the join record (HASH: n,
-- done, failed, policy "run"/"dead", to = the stream the callback goes to, body = its
-- body, state "open"/"fired"/"dead", fired = Unix ms) and its results (HASH: child index ->
-- MessagePack [state, job key, result / error / reason]). A child's end is reported once
-- per index (HSETNX): a report may arrive twice (moved again by a drainer that died) and
-- children may report before the join is opened (a handler's send, drained later): the
-- counts are kept until the record says how many to wait for.

-- the callback, once: every child reported and the join is open; returns 2 when it fired
local function join_fire(jkey, dead)
  local v = redis.call('HMGET', jkey, 'n', 'done', 'failed', 'fired', 'policy', 'to', 'body')
  local n, done, failed = tonumber(v[1]), tonumber(v[2] or '0'), tonumber(v[3] or '0')
  if not n or v[4] or done + failed < n then return 1 end
  local now = now_ms()
  if failed > 0 and v[5] == 'dead' then
    local dead_id = redis.call('XADD', dead, '*', 'reason', 'join_failed', 'error_type',
      'JoinFailed', 'detail', failed .. ' of ' .. n .. ' children failed', 'src_stream', v[6],
      'src_id', '0-0', 'attempts', '0', 'ts', tostring(now), 'f.' .. BODY, v[7])
    redis.call('HSET', jkey, 'fired', now, 'state', 'dead', 'dead_letter_id', dead_id)
  else
    local id = redis.call('XADD', v[6], '*', BODY, v[7])
    redis.call('HSET', jkey, 'fired', now, 'state', 'fired', 'callback_id', id)
  end
  return 2
end

-- one child's end: 0 already reported, 1 counted, 2 counted and the callback fired
local function join_report(jkey, rkey, dead, index, state, blob, ttl)
  if redis.call('HSETNX', rkey, index, blob) == 0 then return 0 end
  redis.call('HINCRBY', jkey, state == 'done' and 'done' or 'failed', 1)
  redis.call('PEXPIRE', rkey, ttl)
  redis.call('PEXPIRE', jkey, ttl)
  return join_fire(jkey, dead)
end

-- a delivery's end report (its job is a join's child): ``spec`` is "" (none) or
-- MessagePack {1, join KEYS index, results KEYS index, dead KEYS index, child index,
-- ttl ms, job key, done value} (the join is reachable here) or {2, outbox KEYS index,
-- callback stream, join key, child index, ttl ms, job key, done value} (Redis Cluster,
-- the join in another slot: the report waits in this stream's outbox, fields k = "join",
-- t callback stream, j join key, i index, s state, v value, l ttl, for a drainer that
-- records it with join.lua);
-- ``state`` is how the job ended, ``detail`` the error or reason; the done value is the
-- worker's (the result packed with its codec), or ``record``: the done record of a
-- duplicate: MessagePack ["record", job key] then the record as it is
local function end_report(spec, state, detail, record)
  if not spec or spec == '' then return end
  local s = cmsgpack.unpack(spec)
  local value = s[#s]
  if record then value = cmsgpack.pack({'record', s[#s - 1]}) .. record end
  if state ~= 'done' then value = cmsgpack.pack({state, s[#s - 1], detail or ''}) end
  if s[1] == 1 then
    join_report(KEYS[s[2]], KEYS[s[3]], KEYS[s[4]], s[5], state, value, s[6])
  else
    redis.call('XADD', KEYS[s[2]], '*', 'k', 'join', 't', s[3], 'j', s[4], 'i', s[5],
               's', state, 'v', value, 'l', s[6])
  end
end
