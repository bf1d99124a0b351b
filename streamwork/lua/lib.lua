-- lib: shared functions, prepended by scripts.py to the scripts that use them (Lua has no
-- includes). XACK checks no ownership, so every write to a delivery first asks owned_ids.

-- "<ms>-<seq>" -> ms, seq as numbers
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

-- the server's clock in Unix milliseconds
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- set of the ids (of ``ids``) that ``consumer`` owns in the group's PEL: ONE XPENDING over
-- the batch's id range filtered to the consumer (plus single lookups only if that listing
-- was truncated)
local function owned_ids(stream, group, consumer, ids)
  local owned = {}
  if #ids == 0 then return owned end
  local lo, hi = ids[1], ids[1]
  local lm, ls = parse_id(lo)
  local hm, hs = lm, ls
  for _, id in ipairs(ids) do
    local m, s = parse_id(id)
    if m < lm or (m == lm and s < ls) then lo, lm, ls = id, m, s end
    if m > hm or (m == hm and s > hs) then hi, hm, hs = id, m, s end
  end
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

-- whether this consumer still holds delivery ``id``: through the PEL (``owned``), or, for a
-- delivery adopted after its entry was deleted, through its ``member`` in the delayed ZSET
local function still_held(owned, delayed, id, member)
  if member ~= '' then return redis.call('ZSCORE', delayed, member) ~= false end
  return owned[id] == true
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

