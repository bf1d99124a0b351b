-- lib_owned: prepended (by scripts.py) to scripts that check ownership of a batch.
-- owned_ids(stream, group, consumer, ids) -> set of the ids this consumer owns, from ONE
-- XPENDING over the batch's id range filtered to the consumer (plus single lookups only if
-- that listing was truncated). XACK itself checks no ownership, so every write needs this.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

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
  if #rows >= limit then -- truncated: look the rest up one by one
    for _, id in ipairs(ids) do
      if not owned[id] then
        local p = redis.call('XPENDING', stream, group, id, id, 1)
        owned[id] = p[1] ~= nil and p[1][2] == consumer
      end
    end
  end
  return owned
end

