-- tokenbucket.lua: one token bucket per client, kept in Redis.
--
-- A bucket holds up to `capacity` tokens and refills continuously at `rate`
-- tokens per second; a call takes `cost` tokens if the bucket holds that
-- many, and takes nothing otherwise.
--
--   KEYS[1]  the bucket: a hash {tokens = "<%.17g>", ts = "<Redis time, us>"}
--   ARGV[1]  capacity  tokens in a full bucket; a number > 0 and at most
--                      2^53 (9007199254740992), past which a double cannot
--                      count single tokens (2^54 - 1 is 2^54)
--   ARGV[2]  rate      tokens added per second; a finite number > 0
--   ARGV[3]  cost      tokens this call takes; a finite number >= 0
--                      (0 peeks: it reports the bucket and changes nothing)
--
-- Reply, an array of four:
--   [1] 1 if the call was allowed (cost taken), 0 if denied (integer)
--   [2] tokens left after the call, exact (string)
--   [3] ms until `cost` tokens will be there: "0" when allowed, "never" when
--       cost > capacity (no wait can help), else exact (string)
--   [4] ms until the bucket is full again, exact (string)
--
-- Bad arguments get an error reply ("ERR tokenbucket: <field>: ...") and
-- leave the bucket untouched.
--
-- Atomicity: Redis runs a script to its end without running any other
-- command in between, so reading the bucket, refilling, deciding and writing
-- back are one indivisible step; two callers can never both spend the same
-- token. The script touches KEYS[1] only, so it runs unchanged on Redis
-- Cluster (the key picks the node).

-- An error reply, with the ERR code clients expect.
local function fail(msg)
  return redis.error_reply('ERR tokenbucket: ' .. msg)
end

-- Fractions leave the script as strings of 17 significant digits: enough to
-- round-trip any double exactly (tostring keeps only 14). Numbers returned in
-- a table would be truncated to integers by Redis.
local function exact(x)
  return string.format('%.17g', x)
end

-- Show a caller's argument in an error, quoted and kept short.
local function shown(raw)
  if raw == nil then
    return 'nothing'
  end
  return string.format('%q', string.sub(raw, 1, 40))
end

-- Parse ARGV[i] as a finite number. Redis's Lua 5.1 tonumber follows C's
-- strtod, so it accepts "nan", "inf", "infinity" and overflowing input such
-- as "1e999" (inf): those are rejected here, along with anything tonumber
-- does not read as a number. v ~= v is true only for NaN.
local function finite(name, i)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v == math.huge or v == -math.huge then
    return nil, fail(name .. ': must be a finite number, got ' .. shown(ARGV[i]))
  end
  return v
end

-- Validate everything before touching the bucket, so a bad call changes
-- nothing.
if #KEYS ~= 1 then
  return fail('want exactly 1 key (the bucket), got ' .. #KEYS)
end
if #ARGV ~= 3 then
  return fail('want 3 arguments (capacity, rate, cost), got ' .. #ARGV)
end
local capacity, rate, cost, err
capacity, err = finite('capacity', 1)
if err then return err end
if not (capacity > 0) then
  return fail('capacity: must be > 0, got ' .. shown(ARGV[1]))
end
-- Above 2^53 a bucket's balance minus a cost of 1 can round back to the
-- balance: every call would be admitted and none would spend.
if capacity > 9007199254740992 then
  return fail('capacity: must be at most 9007199254740992 (2^53), got ' .. shown(ARGV[1]))
end
rate, err = finite('rate', 2)
if err then return err end
if not (rate > 0) then
  return fail('rate: must be > 0, got ' .. shown(ARGV[2]))
end
-- Every wait the reply quotes is at most capacity/rate seconds; it must be
-- a finite number of ms (capacity 1e300 at rate 1e-300 is not).
if capacity / rate * 1000 == math.huge then
  return fail('rate: too small for capacity ' .. shown(ARGV[1]) ..
    ': filling the bucket would take forever, got ' .. shown(ARGV[2]))
end
cost, err = finite('cost', 3)
if err then return err end
if cost < 0 then
  return fail('cost: must be >= 0, got ' .. shown(ARGV[3]))
end

local key = KEYS[1]

-- The clock is Redis's, never the caller's: gateways and sidecars with
-- skewed clocks all see one timeline. TIME gives seconds and microseconds;
-- their sum in microseconds (about 1.8e15) is an integer well below 2^53, so
-- the double holds it exactly. Calling TIME before writing is allowed because
-- Redis 7 replicates a script's effects (the writes), not the script.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- Read the bucket. A key that does not exist is a client seen for the first
-- time: it starts full.
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens
local existed = state[1] or state[2]
-- Set when the bucket was last written at a time Redis's clock has not
-- reached yet: the clock stepped back since (below).
local ahead = false
if not existed then
  tokens = capacity
else
  local stored, ts = tonumber(state[1]), tonumber(state[2])
  if not stored or not ts or stored ~= stored or ts ~= ts then
    return fail('bucket holds unreadable state (tokens=' .. shown(state[1] or nil) ..
      ', ts=' .. shown(state[2] or nil) .. ')')
  end
  -- Continuous refill for the time since the last write, capped at capacity
  -- (a plan that shrank caps the old balance too). If Redis's clock stepped
  -- back (a failover to a node with a different clock, an NTP step), no
  -- time has passed: refill never goes negative. The bucket is then
  -- stamped now by whatever this call does (keep, below), so that it
  -- refills from now on instead of staying as it is until the clock is
  -- back at the old stamp: a step back of an hour would otherwise deny a
  -- spent bucket for the hour, whatever the plan.
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
    ahead = true
  end
  tokens = math.min(capacity, stored + elapsed * rate / 1000000)
end

-- The key's expiry, in ms, for a bucket holding `tokens`: after
-- (capacity - tokens)/rate seconds it is full again, exactly as a missing key
-- reads, so the key can go. One extra second covers the ms rounding. Capped
-- at 2^53 ms (285,000 years) so the integer PEXPIRE needs stays exact and in
-- range.
local function ttl(tokens)
  local ms = math.ceil((capacity - tokens) / rate * 1000) + 1000
  if ms > 9007199254740992 then
    ms = 9007199254740992
  end
  return ms
end

-- A refused call writes nothing, but the bucket it read must not vanish
-- before it is full at this call's plan. Under the plan that last wrote it,
-- the expiry that write set always suffices (it is at least a second longer
-- than the refill the bucket still needs), and nothing is written. Under a
-- plan changed since (a slower rate, a larger capacity), the old expiry can
-- come first, and a key gone reads as a full bucket: a client denied at the
-- new plan would be handed its whole capacity when the old plan's expiry
-- passed. Such a key gets the expiry this plan needs. PTTL and PEXPIRE run
-- under pcall: an ACL user without +pttl, or a replica that refuses the
-- write, still gets its denial, only without the longer expiry.
--
-- A refused call on a bucket stamped ahead of Redis's clock also stamps it
-- now, keeping the stored balance as it is (the one write a denial makes
-- under an unchanged plan, and only after a clock step): the refill it was
-- not given is lost, so a client waits at most the time its plan takes to
-- refill a whole bucket longer than without the step, not the step. The
-- expiry is left: it is later than ever on the stepped clock.
local function keep(tokens)
  if not existed then
    return
  end
  if ahead then
    redis.pcall('HSET', key, 'ts', string.format('%d', now))
  end
  local want = ttl(tokens)
  local left = redis.pcall('PTTL', key)
  if type(left) == 'number' and left >= 0 and left < want - 500 then
    redis.pcall('PEXPIRE', key, string.format('%d', want))
  end
end

-- A cost above capacity can never succeed, however long the caller waits:
-- say so instead of quoting a wait. Nothing is spent; the stored state is
-- not written (keep may lengthen the key's expiry, or restamp a bucket
-- stamped ahead of the clock).
if cost > capacity then
  keep(tokens)
  return {0, exact(tokens), 'never', exact((capacity - tokens) / rate * 1000)}
end

-- Denied: spend nothing and write nothing. The stored (tokens, ts) pair
-- still describes the bucket exactly, since the next call refills from it
-- with the same formula; not writing back avoids accumulating rounding and
-- keeps denials (the bulk of an abusive client's traffic) free of writes
-- (but for keep, after a plan change or a step back of Redis's clock).
if tokens < cost then
  keep(tokens)
  return {0, exact(tokens), exact((cost - tokens) / rate * 1000),
    exact((capacity - tokens) / rate * 1000)}
end

-- Allowed. A peek (cost 0) changes nothing, so it writes nothing either and
-- never creates a key.
if cost > 0 then
  tokens = tokens - cost
  -- The balance is stored with 17 digits, so it is read back as the very
  -- same double; ts is an integer number of microseconds.
  redis.call('HSET', key, 'tokens', exact(tokens), 'ts', string.format('%d', now))
  -- Expiry: after capacity/rate seconds any bucket is full again (ttl(0),
  -- the longest any balance needs), so the key can go. Memory then tracks
  -- active clients only.
  redis.call('PEXPIRE', key, string.format('%d', ttl(0)))
end
return {1, exact(tokens), '0', exact((capacity - tokens) / rate * 1000)}
