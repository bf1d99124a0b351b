-- trim: drop stream entries that every group has read and acknowledged and that are older
-- than the retention cutoff; never an entry still pending or unread in any group (XTRIM
-- itself ignores the PEL, so the safe MINID is computed here, atomically).
-- KEYS[1] stream
-- ARGV[1] cutoff in Unix ms: only entries older than this may go
-- Returns: number of entries trimmed
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return 0 end
local minid = ARGV[1] .. '-0'
for _, g in ipairs(groups) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if older(info['last-delivered-id'], minid) then minid = info['last-delivered-id'] end
  local p = redis.call('XPENDING', KEYS[1], info['name'])
  if p[1] > 0 and older(p[2], minid) then minid = p[2] end
end
return redis.call('XTRIM', KEYS[1], 'MINID', minid)
