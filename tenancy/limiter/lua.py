"""The two Lua scripts of the Redis limiter: one per operation, so each is atomic.

Numbers cross the Lua boundary as strings: Redis truncates Lua numbers to integers.
Limits of -1 mean "not limited". All keys of one call share the {tenant} hash tag.
"""

from __future__ import annotations

# KEYS: 1 rpm bucket, 2 tpm bucket, 3 concurrency zset, 4 budget counter, 5 lease hash,
#       6 tokens-in-flight zset (member "<lease id>|<cost>", score: the lease's expiry)
# ARGV: 1 now, 2 rpm, 3 tpm, 4 cost, 5 max_concurrent, 6 budget, 7 budget_end,
#       8 lease ttl (s), 9 lease id, 10 concurrency retry (s), 11 "1": a missing budget
#       counter must be seeded from the usage ledger first, 12 max_tokens_in_flight
# Returns {ok, reason, retry, rq_level, tk_level, budget_used}; levels are before
# consumption on denial and after it on success. Reason "seed" (nothing consumed):
# the budget counter is missing; the caller seeds it and calls again.
ACQUIRE = r"""
local now = tonumber(ARGV[1])
local rpm = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local maxc = tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local budget_end = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local maxif = tonumber(ARGV[12] or '-1')

local function level(key, cap)
  local v = redis.call('HMGET', key, 'l', 't')
  if not v[1] then return cap end
  local l = tonumber(v[1]) + (now - tonumber(v[2])) * cap / 60.0
  if l > cap then l = cap end
  return l
end

local function retry(l, c, cap)
  if c > cap then return 60.0 end
  local r = (c - l) * 60.0 / cap
  if r < 0 then r = 0 end
  return r
end

local rq = 0
local tk = 0
if rpm >= 0 then rq = level(KEYS[1], rpm) end
if tpm >= 0 then tk = level(KEYS[2], tpm) end
local used = 0
if budget >= 0 then
  local raw = redis.call('GET', KEYS[4])
  if not raw and ARGV[11] == '1' then
    return {0, 'seed', '0', tostring(rq), tostring(tk), '0'}
  end
  used = tonumber(raw or '0')
end

if maxc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= maxc then
    return {0, 'concurrency', ARGV[10], tostring(rq), tostring(tk), tostring(used)}
  end
end
if maxif >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  local held = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    held = held + tonumber(string.match(m, '|(%d+)$') or '0')
  end
  if held + cost > maxif then
    return {0, 'tokens_in_flight', ARGV[10], tostring(rq), tostring(tk), tostring(used)}
  end
end
if rpm >= 0 and rq < 1 then
  return {0, 'requests', tostring(retry(rq, 1, rpm)), tostring(rq), tostring(tk), tostring(used)}
end
if tpm >= 0 and tk < cost then
  return {0, 'tokens', tostring(retry(tk, cost, tpm)), tostring(rq), tostring(tk), tostring(used)}
end
if budget >= 0 and used + cost > budget then
  local r = budget_end - now
  if r < 0 then r = 0 end
  return {0, 'budget', tostring(r), tostring(rq), tostring(tk), tostring(used)}
end

local ttl_ms = math.ceil(ttl * 1000)
if rpm >= 0 then
  rq = rq - 1
  redis.call('HSET', KEYS[1], 'l', tostring(rq), 't', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 61000)
end
if tpm >= 0 then
  tk = tk - cost
  redis.call('HSET', KEYS[2], 'l', tostring(tk), 't', ARGV[1])
  -- an overdrawn bucket needs longer than a minute to refill
  local full_ms = math.ceil((tpm - tk) * 60000 / math.max(tpm, 1)) + 1000
  redis.call('PEXPIRE', KEYS[2], full_ms)
end
if budget >= 0 then
  used = used + cost
  redis.call('SET', KEYS[4], tostring(used))
  redis.call('EXPIREAT', KEYS[4], math.ceil(budget_end) + 86400)
end
if maxc >= 0 then
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[9])
  redis.call('PEXPIRE', KEYS[3], ttl_ms)
end
if maxif >= 0 then
  redis.call('ZADD', KEYS[6], now + ttl, ARGV[9] .. '|' .. ARGV[4])
  redis.call('PEXPIRE', KEYS[6], ttl_ms)
end
redis.call('HSET', KEYS[5], 'reserved', ARGV[4], 'tpm', ARGV[3], 'budget', ARGV[6],
  'maxc', ARGV[5], 'maxif', tostring(maxif))
redis.call('PEXPIRE', KEYS[5], ttl_ms)
return {1, '', '0', tostring(rq), tostring(tk), tostring(used)}
"""

# KEYS: 1 tpm bucket, 2 concurrency zset, 3 budget counter, 4 lease hash,
#       5 tokens-in-flight zset
# ARGV: 1 now, 2 actual tokens, 3 lease id
# Returns 1 when the lease was settled, 0 when it was already gone (idempotent).
RELEASE = r"""
local v = redis.call('HMGET', KEYS[4], 'reserved', 'tpm', 'budget', 'maxc', 'maxif')
if not v[1] then return 0 end
redis.call('DEL', KEYS[4])
if tonumber(v[5] or '-1') >= 0 then redis.call('ZREM', KEYS[5], ARGV[3] .. '|' .. v[1]) end
local now = tonumber(ARGV[1])
local delta = tonumber(v[1]) - tonumber(ARGV[2])
local tpm = tonumber(v[2])
if tonumber(v[4]) >= 0 then redis.call('ZREM', KEYS[2], ARGV[3]) end
if tpm >= 0 then
  local b = redis.call('HMGET', KEYS[1], 'l', 't')
  local l = tpm
  if b[1] then l = tonumber(b[1]) + (now - tonumber(b[2])) * tpm / 60.0 end
  if l > tpm then l = tpm end
  l = l + delta
  if l > tpm then l = tpm end
  redis.call('HSET', KEYS[1], 'l', tostring(l), 't', ARGV[1])
  local full_ms = math.ceil((tpm - l) * 60000 / math.max(tpm, 1)) + 1000
  redis.call('PEXPIRE', KEYS[1], full_ms)
end
if tonumber(v[3]) >= 0 then
  local used = tonumber(redis.call('GET', KEYS[3]) or 'nil')
  if used then
    used = used - delta
    if used < 0 then used = 0 end
    redis.call('SET', KEYS[3], tostring(used), 'KEEPTTL')
  end
end
return 1
"""
