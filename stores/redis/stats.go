package idemredis

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/redis/go-redis/v9"
)

// statsScript: KEYS index; ARGV stale after (µs). Returns {now, in
// progress, stale, oldest locked at or -1} for one shard. It walks the
// shard's in-progress index and reads each entry's record, so that an entry
// whose record expired while in progress (a leftover ListStale has not yet
// removed) is not counted, and takes the lease's start (l) from the record:
// the index is scored by lease deadline. The record's name is built from
// the index's, with the same hash tag, so it is in the index's Cluster
// slot; it reads only.
var statsScript = redis.NewScript(scriptPrelude + `
local base = string.sub(KEYS[1], 1, #KEYS[1] - #'inprogress') .. 'r:'
local cutoff = now - tonumber(ARGV[1])
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
local n, stale, oldest = 0, 0, -1
for i = 1, #members do
	local v = redis.call('HMGET', base .. members[i], 's', 'l')
	if v[1] == 'in_progress' then
		local locked = tonumber(v[2])
		n = n + 1
		if locked <= cutoff then stale = stale + 1 end
		if oldest < 0 or locked < oldest then oldest = locked end
	end
end
return {int(now), n, stale, int(oldest)}
`)

// Stats implements idemstore.Store from the in-progress indexes, without KEYS or
// SCAN: one script call per shard in one pipeline (one round trip per
// Cluster primary), each walking its shard's in-progress records, so it
// costs time in proportion to the records in progress, not to the store.
//
// Completed, Failed and Released are NotCounted: Redis keeps no index of
// settled or released records, and counting them would mean scanning every key. Expired is 0,
// counted: Redis deletes every record at its ExpiresAt itself, so none
// awaits a purge. Now is the clock of the primary that answered last;
// Stale and OldestLockedAt use each shard's primary's clock, as ListStale
// does.
func (s *Store) Stats(ctx context.Context, staleAfter time.Duration) (idemstore.Stats, error) {
	var cmds []*redis.Cmd
	err := s.pipelinedScript(ctx, statsScript, func(p redis.Pipeliner, eval func(redis.Scripter, []string, ...any) *redis.Cmd) {
		cmds = cmds[:0]
		for shard := range IndexShards {
			cmds = append(cmds, eval(p, []string{s.indexKey(shard)}, micros(staleAfter)))
		}
	}, func() []*redis.Cmd { return cmds })
	if err != nil {
		return idemstore.Stats{}, wrap("stats", err)
	}
	st := idemstore.Stats{Completed: idemstore.NotCounted, Failed: idemstore.NotCounted, Released: idemstore.NotCounted}
	oldest := int64(-1)
	for _, cmd := range cmds {
		vals, err := cmd.Int64Slice()
		if err != nil || len(vals) != 4 {
			return idemstore.Stats{}, wrap("stats", fmt.Errorf("%w: stats answer %v: %v", ErrCorruptRecord, cmd.Val(), err))
		}
		now := time.UnixMicro(vals[0])
		if now.After(st.Now) {
			st.Now = now
		}
		st.InProgress += idemstore.Count(vals[1])
		st.Stale += idemstore.Count(vals[2])
		if vals[3] >= 0 && (oldest < 0 || vals[3] < oldest) {
			oldest = vals[3]
		}
	}
	if oldest >= 0 {
		st.OldestLockedAt = time.UnixMicro(oldest)
	}
	return st, nil
}
