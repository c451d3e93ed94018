//! The Lua scripts: each does its whole job in one round trip, atomically.

use std::sync::LazyLock;

use redis::Script;

/// Sends a batch: drops the items whose dedupe marker is already set, adds the others to
/// their lane's stream (creating the stream and its group, and registering it, the first
/// time).
///
/// KEYS: normal stream, urgent stream, namespaces set, new-streams stream, then one dedupe
/// marker per item that has a dedupe key, in item order.
/// ARGV: group, window (ms), then per item: has a dedupe key (`1`/`0`), urgent (`1`/`0`),
/// the number of field arguments `n`, and the `n` field arguments (name, value, ...).
/// Returns the number of items added.
pub(crate) static DISPATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local group, window = ARGV[1], ARGV[2]
local ready = {}
local function ensure(stream)
  if ready[stream] then return end
  ready[stream] = true
  if redis.call('SADD', KEYS[3], stream) == 1 or redis.call('EXISTS', stream) == 0 then
    pcall(redis.call, 'XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
    redis.call('XADD', KEYS[4], 'MAXLEN', '1', '*', 'stream', stream)
  end
end
local added, k, i = 0, 5, 3
while i <= #ARGV do
  local dedupe, urgent, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local fresh = true
  if dedupe == '1' then
    fresh = redis.call('SET', KEYS[k], '1', 'NX', 'PX', window)
    k = k + 1
  end
  if fresh then
    local stream = KEYS[1]
    if urgent == '1' then stream = KEYS[2] end
    ensure(stream)
    redis.call('XADD', stream, '*', unpack(ARGV, i + 3, i + 2 + n))
    added = added + 1
  end
  i = i + 3 + n
end
return added
"#,
    )
});

/// Claims up to `count` entries for one consumer: first (when `min_idle` > 0) the consumer's
/// own pending entries it does not have in hand (XPENDING for the consumer, then XCLAIM: a
/// claim whose reply never reached it, an acknowledgement that failed), then entries pending
/// for longer than `min_idle` ms (XPENDING IDLE, then XCLAIM: those of a consumer that died,
/// or whose handler hangs, or whose acknowledgement was lost), except the excluded ones (in
/// hand at the claiming consumer itself), then new ones (XREADGROUP `>`),
/// urgent streams before normal ones. When fewer than `count` were found, also returns for
/// each stream read the id its group has delivered up to, for a blocking XREAD that wakes at
/// the next new entry without taking it.
///
/// KEYS: for one namespace, its urgent and normal streams; for every namespace, the
/// namespaces set and the new-streams stream.
/// ARGV: group, consumer, count, min_idle (ms, 0: no reclaim), mode (`one`/`all`), the
/// prefix of urgent stream keys, prune (ms, 0: none): the group forgets the other consumers
/// that hold nothing and have taken nothing for longer (dead ones; an idle live one is added
/// back by its next read); then the excluded entries as `stream, id` pairs (with `min_idle` >
/// 0: every entry the consumer has in hand).
/// Returns `{entries, wake}`: entries as `{stream, id, {field, value, ...}}`, wake as a flat
/// `{key, id, key, id, ...}` (empty when `count` entries were found).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local group, consumer = ARGV[1], ARGV[2]
local count, min_idle, prune = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[7])
local streams, wake = {}, {}
local excluded, excluded_count = {}, 0
for j = 8, #ARGV - 1, 2 do
  excluded[ARGV[j] .. ' ' .. ARGV[j + 1]] = true
  excluded_count = excluded_count + 1
end
if ARGV[5] == 'all' then
  local urgent_prefix = ARGV[6]
  local normal = {}
  for _, s in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if string.sub(s, 1, #urgent_prefix) == urgent_prefix then
      table.insert(streams, s)
    else
      table.insert(normal, s)
    end
  end
  for _, s in ipairs(normal) do table.insert(streams, s) end
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if last[1] then
    table.insert(wake, KEYS[2]); table.insert(wake, last[1][1])
  else
    table.insert(wake, KEYS[2]); table.insert(wake, '0-0')
  end
else
  streams = {KEYS[1], KEYS[2]}
end
local out = {}
local function take(stream, entries)
  for _, e in ipairs(entries) do
    if e and e[1] then
      table.insert(out, {stream, e[1], e[2]})
      count = count - 1
    end
  end
end
-- Up to `count` ids of pending entries of `s` (XPENDING's extended answer) that are not excluded.
local function pick(s, pending)
  local ids = {}
  for _, p in ipairs(pending) do
    if #ids >= count then break end
    if not excluded[s .. ' ' .. p[1]] then table.insert(ids, p[1]) end
  end
  return ids
end
for _, s in ipairs(streams) do
  if count <= 0 then break end
  if redis.call('EXISTS', s) == 1 then
    if min_idle > 0 then
      -- This consumer's own pending entries that it does not have in hand: taken by a claim
      -- whose reply was lost, or left by an acknowledgement that failed. Taken back at once,
      -- not after min_idle; an id that no longer exists is only acknowledged.
      local ok, mine = pcall(redis.call, 'XPENDING', s, group, '-', '+', count + excluded_count, consumer)
      if ok then
        local ids = pick(s, mine)
        if #ids > 0 then
          local before = #out
          take(s, redis.call('XCLAIM', s, group, consumer, 0, unpack(ids)))
          local back = {}
          for j = before + 1, #out do back[out[j][2]] = true end
          for _, id in ipairs(ids) do
            if not back[id] then redis.call('XACK', s, group, id) end
          end
        end
      end
    end
    if min_idle > 0 and count > 0 then
      local ok, idle = pcall(redis.call, 'XPENDING', s, group, 'IDLE', min_idle, '-', '+', count + excluded_count)
      if ok then
        local ids = pick(s, idle)
        if #ids > 0 then take(s, redis.call('XCLAIM', s, group, consumer, min_idle, unpack(ids))) end
      end
    end
    if count > 0 then
      local ok, r = pcall(redis.call, 'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', s, '>')
      if not ok then
        pcall(redis.call, 'XGROUP', 'CREATE', s, group, '0')
        ok, r = pcall(redis.call, 'XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', s, '>')
      end
      if ok and r then take(s, r[1][2]) end
    end
  end
end
if prune > 0 then
  for _, s in ipairs(streams) do
    local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', s, group)
    if ok then
      for _, c in ipairs(consumers) do
        local name, pending, idle
        for j = 1, #c, 2 do
          if c[j] == 'name' then name = c[j + 1]
          elseif c[j] == 'pending' then pending = c[j + 1]
          elseif c[j] == 'idle' then idle = c[j + 1] end
        end
        if name and name ~= consumer and pending == 0 and idle and idle > prune then
          redis.call('XGROUP', 'DELCONSUMER', s, group, name)
        end
      end
    end
  end
end
if count > 0 then
  for _, s in ipairs(streams) do
    local id = '0-0'
    if redis.call('EXISTS', s) == 1 then
      local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', s)
      if ok then
        for _, g in ipairs(groups) do
          local name, last
          for j = 1, #g, 2 do
            if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then last = g[j + 1] end
          end
          if name == group and last then id = last end
        end
      end
    end
    table.insert(wake, s); table.insert(wake, id)
  end
else
  wake = {}
end
return {out, wake}
"#,
    )
});

/// Hands an entry back: when the entry is still pending for this consumer (not reclaimed by
/// another after it idled too long), acknowledges and deletes it and adds the same fields
/// again at the end of its stream, for any consumer to take at once.
///
/// KEYS: the stream. ARGV: group, consumer, entry id, then the entry's fields (name, value,
/// ...). Returns 1 when handed back, 0 when the entry was no longer this consumer's.
pub(crate) static HAND_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not pending[1] or pending[1][2] ~= ARGV[2] then return 0 end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
return 1
"#,
    )
});
