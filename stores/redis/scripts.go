package idemredis

import "github.com/redis/go-redis/v9"

// The Lua scripts. Each runs atomically on the server, declares every key it
// touches in KEYS (the record and its shard's index, which share a hash tag
// and so a Cluster slot), and reads the time from the server's TIME, never
// from the application. Times are microseconds since the Unix epoch, which a
// Lua number (a double) holds exactly.
//
// A record keeps no nonce (idem.Record.Nonce is always empty): Redis can
// lose records, and a downstream key must not change under the retry that a
// lost record lets run again (see Store). A record is one hash:
//
//	f     fingerprint (bytes)
//	s     state: in_progress, completed, failed or released
//	t     lease token of the current holder
//	q     request id of the attempt that created the record
//	c     created at (µs)
//	l     locked at: when the current lease was taken (µs)
//	e     lease expires at (µs): l plus the claim's lease, or Keep's now
//	x     expires at (µs); the hash's PEXPIREAT is x rounded up to the ms
//	r     1 when the current lease was taken over from a stale holder
//	u     1 when the record is Uncertain (Keep set it); absent otherwise
//	code  stored status (settled records only)
//	h     stored headers, idemstore.EncodeHeader (settled records only)
//	b     stored body (settled records only)
//
// The index of a shard is a sorted set of the shard's in-progress records,
// member "escaped principal:escaped key", score their lease deadline (e),
// so that the stale ones are a range of it.

// scriptPrelude is shared by the scripts that need the server's clock.
const scriptPrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function int(n) return string.format('%d', n) end
`

// claimScript: KEYS record, index; ARGV member, fingerprint, token, request
// id, lease (µs), retention (µs), take over uncertain ('1' or '0'). It
// returns {claimed, reclaimed, now, field, value, …} with the record as
// stored after the script.
//
//   - absent (or past x, which Redis is about to delete): a fresh record.
//   - in progress with this very token: the same script ran already and its
//     answer was lost (the client retried it); answer as the first run did.
//   - released: a fresh record for this request.
//   - in progress, past its lease deadline e, same fingerprint, and not
//     Uncertain unless ARGV asks to take Uncertain records over: taken over
//     with the new token, a new lease, a new expiry and the Uncertain mark
//     it had. The check and the write are one atomic script, so the token
//     it replaces cannot change in between: the takeover is fenced by
//     atomicity.
//   - anything else: returned as it is, and nothing is written. A replay
//     costs this one read.
var claimScript = redis.NewScript(scriptPrelude + `
local rec = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #rec, 2 do f[rec[i]] = rec[i + 1] end
local function answer(claimed, reclaimed, fields)
	local out = {claimed, reclaimed, int(now)}
	for i = 1, #fields do out[#out + 1] = fields[i] end
	return out
end
local function grant(reclaimed, created, uncertain)
	local e, x = now + tonumber(ARGV[5]), now + tonumber(ARGV[6])
	redis.call('DEL', KEYS[1])
	redis.call('HSET', KEYS[1], 'f', ARGV[2], 's', 'in_progress', 't', ARGV[3], 'q', ARGV[4],
		'c', int(created), 'l', int(now), 'e', int(e), 'x', int(x), 'r', tostring(reclaimed))
	if uncertain then redis.call('HSET', KEYS[1], 'u', '1') end
	redis.call('PEXPIREAT', KEYS[1], int(math.ceil(x / 1000)))
	redis.call('ZADD', KEYS[2], int(e), ARGV[1])
	return answer(1, reclaimed, redis.call('HGETALL', KEYS[1]))
end
if f['s'] == nil or now >= tonumber(f['x']) then
	return grant(0, now, false)
end
if f['s'] == 'in_progress' and f['t'] == ARGV[3] then
	return answer(1, tonumber(f['r']) or 0, rec)
end
if f['s'] == 'released' then
	return grant(0, now, false)
end
local e = tonumber(f['e'])
if f['s'] == 'in_progress' and e and now >= e and f['f'] == ARGV[2] and (f['u'] ~= '1' or ARGV[7] == '1') then
	return grant(1, tonumber(f['c']), f['u'] == '1')
end
return answer(0, 0, rec)
`)

// settleScript: KEYS record, index; ARGV member, token, state, status,
// headers, body, and, when the store has a subscription, its channel and
// the record's NotifyID. Returns 1 when it stored the outcome (and then
// publishes the NotifyID on the channel), 2 when this token had stored
// that state already (a retried settle whose first answer was lost), 0
// when the fence missed: the record is gone, settled, or held by another
// token. The record keeps the expiry its claim set and loses its Uncertain
// mark.
var settleScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[2] ~= ARGV[2] then return 0 end
if v[1] == 'in_progress' then
	redis.call('HSET', KEYS[1], 's', ARGV[3], 'code', ARGV[4], 'h', ARGV[5], 'b', ARGV[6])
	redis.call('HDEL', KEYS[1], 'u')
	redis.call('ZREM', KEYS[2], ARGV[1])
	if ARGV[7] then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
	return 1
end
if v[1] == ARGV[3] then return 2 end
return 0
`)

// releaseScript: KEYS record, index; ARGV member, token, and, when the
// store has a subscription, its channel and the record's NotifyID. Marks
// the record released, clears its Uncertain mark, removes its index entry
// and publishes the NotifyID when it is in progress under token; returns
// 1, or 0 when the fence missed. The record keeps its expiry (x and the
// key's PEXPIREAT), after which Redis deletes it.
var releaseScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] == 'in_progress' and v[2] == ARGV[2] then
	redis.call('HSET', KEYS[1], 's', 'released')
	redis.call('HDEL', KEYS[1], 'u')
	redis.call('ZREM', KEYS[2], ARGV[1])
	if ARGV[3] then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
	return 1
end
return 0
`)

// keepScript: KEYS record, index; ARGV member, token. Fenced like
// releaseScript: when the record is in progress under token it marks it
// Uncertain and ends its lease (e and its index score become now), leaving
// it in progress under the same token; returns 1, or 0 when the fence
// missed. The record keeps its expiry: HSET leaves the key's PEXPIREAT as it
// is.
var keepScript = redis.NewScript(scriptPrelude + `
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] == 'in_progress' and v[2] == ARGV[2] then
	redis.call('HSET', KEYS[1], 'u', '1', 'e', int(now))
	redis.call('ZADD', KEYS[2], int(now), ARGV[1])
	return 1
end
return 0
`)

// staleScript: KEYS index; ARGV limit. Returns {now, member, score, …}: at
// most limit index entries whose lease deadline is at or before now, the
// longest expired first. It reads only.
var staleScript = redis.NewScript(scriptPrelude + `
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES', 'LIMIT', '0', ARGV[1])
table.insert(r, 1, int(now))
return r
`)

// pruneScript: KEYS record, index; ARGV member. Removes an index entry whose
// record is no longer in progress (it expired while in progress, its
// holder's claim never settled). Returns 1 when it removed the entry.
var pruneScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 's') ~= 'in_progress' then
	return redis.call('ZREM', KEYS[2], ARGV[1])
end
return 0
`)

// scripts is every script, for Check to load.
var scripts = []*redis.Script{claimScript, settleScript, releaseScript, keepScript, staleScript, pruneScript, statsScript}
