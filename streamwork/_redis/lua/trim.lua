-- trim: drop stream entries that every group has read and acknowledged and that are older
-- than the retention cutoff; never an entry still pending or unread in any group (XTRIM
-- itself ignores the PEL, so the safe MINID is computed here, atomically). One call removes
-- at most ARGV[2] entries, so no call blocks Redis for long however much is trimmable: the
-- caller calls again while the reply says more may be left (each call recomputes the MINID).
-- KEYS[1] stream, KEYS[2] (optional) the stream whose groups all read KEYS[1] too (a
-- priority level of it: every group of the stream reads its levels, joining a level when it
-- first looks); while one of them has not joined KEYS[1] yet, nothing is trimmed there
-- (what it has not read would be lost to it)
-- ARGV[1] cutoff in Unix ms: only entries older than this may go
-- ARGV[2] at most this many entries removed by this call
-- Returns: {entries trimmed, 1 if more may be left (call again) else 0}
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {0, 0} end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  local here = {}
  for _, g in ipairs(groups) do
    for i = 1, #g, 2 do if g[i] == 'name' then here[g[i + 1]] = true end end
  end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    for i = 1, #g, 2 do
      if g[i] == 'name' and not here[g[i + 1]] then return {0, 0} end
    end
  end
end
local minid = ARGV[1] .. '-0'
for _, g in ipairs(groups) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if older(info['last-delivered-id'], minid) then minid = info['last-delivered-id'] end
  local p = redis.call('XPENDING', KEYS[1], info['name'])
  if p[1] > 0 and older(p[2], minid) then minid = p[2] end
end
local limit = tonumber(ARGV[2])
-- whole nodes of the stream wholly below the MINID first: cheap (a node is freed at once),
-- and XTRIM's LIMIT stops before the node that would take the count past the limit
local n = redis.call('XTRIM', KEYS[1], 'MINID', '~', minid, 'LIMIT', limit)
if n > 0 then return {n, 1} end
-- what is left below the MINID shares its node with entries that stay (at most a node's
-- worth), unless nodes hold more than the limit: then trim exactly up to the limit'th entry
local head = redis.call('XRANGE', KEYS[1], '-', minid, 'COUNT', limit + 1)
local below = 0
for _, e in ipairs(head) do
  if older(e[1], minid) then below = below + 1 end
end
if below == 0 then return {0, 0} end
if below > limit then
  return {redis.call('XTRIM', KEYS[1], 'MINID', head[limit + 1][1]), 1}
end
return {redis.call('XTRIM', KEYS[1], 'MINID', minid), 0}
