-- lib: shared functions, prepended by scripts.py to the scripts that use them (Lua has no
-- includes). XACK checks no ownership, so every write to a delivery first asks owned_ids.

-- the server's clock in Unix milliseconds
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- set of the ids (of ``ids``) that ``consumer`` owns in the group's PEL: ONE XPENDING over
-- the milliseconds the batch's ids span, filtered to the consumer (plus single lookups only
-- if that listing was truncated). The span is found without parsing an id: a shorter
-- milliseconds part is an earlier one, and of two as long, the lesser string has the
-- earlier (or the same) milliseconds; XPENDING takes "<ms>" as "<ms>-0" to "<ms>-<max>".
local function owned_ids(stream, group, consumer, ids)
  local owned = {}
  if #ids == 0 then return owned end
  local find = string.find
  local lo, hi = ids[1], ids[1]
  local lod = find(lo, '-', 1, true)
  local hid = lod
  for _, id in ipairs(ids) do
    local d = find(id, '-', 1, true)
    if d < lod or (d == lod and id < lo) then lo, lod = id, d end
    if d > hid or (d == hid and id > hi) then hi, hid = id, d end
  end
  lo, hi = string.sub(lo, 1, lod - 1), string.sub(hi, 1, hid - 1)
  local limit = #ids * 2 + 64
  local rows = redis.call('XPENDING', stream, group, lo, hi, limit, consumer)
  for _, r in ipairs(rows) do owned[r[1]] = true end
  if #rows >= limit then
    for _, id in ipairs(ids) do
      if not owned[id] then
        local p = redis.call('XPENDING', stream, group, id, id, 1)
        owned[id] = p[1] ~= nil and p[1][2] == consumer
      end
    end
  end
  return owned
end

-- true when the stream still holds entry ``id``
local function entry_exists(stream, id)
  return redis.call('XRANGE', stream, id, id)[1] ~= nil
end

-- true when the group's PEL still lists ``id`` (under any consumer)
local function pending_anywhere(stream, group, id)
  return redis.call('XPENDING', stream, group, id, id, 1)[1] ~= nil
end

-- XACK a list of ids in chunks: unpack() of more than ~8000 values overflows Lua's stack
local function xack_all(stream, group, ids)
  for i = 1, #ids, 1000 do
    redis.call('XACK', stream, group, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- A delivery comes from the stream itself (src 0), from the group's retry stream (src 1),
-- or from the stream's high (src 2) or low (src 3) priority level: KEYS[1] and KEYS[2] of
-- every script that works on deliveries, and its last two KEYS. Entry ids of the streams
-- may be equal, so sets of deliveries are keyed by src .. id.
local function delivery_streams()
  return {KEYS[1], KEYS[2], KEYS[#KEYS - 1], KEYS[#KEYS]}
end

-- set of (src .. id) of the deliveries ``consumer`` owns, from one XPENDING per stream
local function owned_by_src(streams, group, consumer, ids, srcs)
  local split = {{}, {}, {}, {}}
  for i, id in ipairs(ids) do
    local part = split[srcs[i] + 1]
    part[#part + 1] = id
  end
  local owned = {}
  for src = 0, #streams - 1 do
    for id, yes in pairs(owned_ids(streams[src + 1], group, consumer, split[src + 1])) do
      if yes then owned[src .. id] = true end
    end
  end
  return owned
end

-- XACK deliveries given as {src -> {id...}}
local function ack_by_src(streams, group, acks)
  for src = 0, #streams - 1 do
    if acks[src] and #acks[src] > 0 then xack_all(streams[src + 1], group, acks[src]) end
  end
end

local function add_ack(acks, src, id)
  acks[src] = acks[src] or {}
  acks[src][#acks[src] + 1] = id
end

-- let go of a delivery that ended: an adopted one (its ``member`` in the retry ZSET stands
-- for ownership) leaves the ZSET now; any other joins ``acks``, for one ack_by_src at the end
local function let_go(acks, retries, member, src, id)
  if member ~= '' then
    redis.call('ZREM', retries, member)
  else
    add_ack(acks, src, id)
  end
end

-- Job records (one per group and job key; see _records.py). The first byte is the state:
-- H held ("H<lease>|<attempt>|<since ms>[|W<due ms>]": the lease of a delivery a worker
-- has read but whose handler has not started; |W: waiting for an in-place retry), R running
-- ("R<lease>|<attempt>|<since ms>", the lease once the handler started; a cancel appends
-- "|C<lease deadline ms>|<cancel ttl ms>|<reason>" and keeps the record for the cancel's
-- ttl), D done, W waiting for a retry, X dead, C cancelled (the rest MessagePack).
local function is_done(record)
  return record and string.sub(record, 1, 1) == 'D'
end

-- whether ``record`` is the lease ``lease`` (held or running)
local function leased_by(record, lease)
  if not record then return false end
  local state = string.sub(record, 1, 1)
  return (state == 'R' or state == 'H') and string.sub(record, 2, #lease + 2) == lease .. '|'
end

-- a running record's cancel request: lease deadline (ms), cancel ttl (ms), reason; or nil
local function cancel_asked(record)
  if not record or string.sub(record, 1, 1) ~= 'R' or not string.find(record, '|C', 1, true) then
    return nil
  end
  local deadline, ttl, reason = string.match(record, '^R[^|]*|[^|]*|[^|]*|C(%d+)|(%d+)|(.*)$')
  if not deadline then return nil end
  return tonumber(deadline), tonumber(ttl), reason
end

-- the cancelled record (C) a job gets when it ends cancelled
local function cancelled_record(now, reason)
  return 'C' .. cmsgpack.pack({now, reason})
end

-- whether this consumer still holds a delivery: through the PEL (``owned`` by src .. id),
-- or, for one adopted after its entry was deleted, through its ``member`` in the retry ZSET
local function still_held(owned, retries, key, member)
  if member ~= '' then return redis.call('ZSCORE', retries, member) ~= false end
  return owned[key] == true
end

-- the code for a delivery we no longer hold: 4 "vanished" when neither the stream nor the
-- group knows the entry any more (the server lost it), else 0 "lost" (someone else has it)
local function lost_code(stream, group, id, member)
  if member == '' and not pending_anywhere(stream, group, id)
      and not entry_exists(stream, id) then
    return 4
  end
  return 0
end

