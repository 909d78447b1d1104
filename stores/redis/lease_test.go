package idemredis_test

import (
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// TestListStaleByLeaseDeadline: ListStale orders by the records' own lease
// deadlines, not by when their leases were taken. long is claimed first
// with the longest lease, short after it with a short one, and kept after
// both with an hour's lease that Keep ends: their deadlines run short,
// kept, long, the reverse of their claims but for short. A takeover moves
// the record out of the list at once. On the standalone server and on the
// Cluster, whose primaries each answer for their own shards.
func TestListStaleByLeaseDeadline(t *testing.T) {
	for name, env := range map[string]func(testing.TB) *idemredistest.Env{
		"Standalone": func(t testing.TB) *idemredistest.Env { return newEnv(t) },
		"Cluster": func(t testing.TB) *idemredistest.Env {
			return idemredistest.NewEnv(t, idemredistest.NewClusterClient(t))
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			s := env(t).Store
			long := claimReq("alice", "long-"+idemredistest.RandHex(4), "body", 600*time.Millisecond)
			short := claimReq("alice", "short-"+idemredistest.RandHex(4), "body", 100*time.Millisecond)
			kept := claimReq("alice", "kept-"+idemredistest.RandHex(4), "body", time.Hour)
			for _, r := range []idemstore.ClaimRequest{long, short} {
				if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
					t.Fatalf("claim %s: %+v, %v", r.Key, res, err)
				}
			}
			time.Sleep(200 * time.Millisecond)
			if res, err := s.Claim(ctx, kept); err != nil || !res.Claimed {
				t.Fatalf("claim %s: %+v, %v", kept.Key, res, err)
			}
			mustNil(t, s.Keep(ctx, leaseOf(kept)))
			time.Sleep(500 * time.Millisecond)

			stale, err := s.ListStale(ctx, 100)
			mustNil(t, err)
			var got []string
			for _, r := range stale {
				got = append(got, r.Key)
				if !r.LeaseExpiresAt.After(r.LockedAt) && r.Key != kept.Key {
					t.Errorf("%s: lease until %v, locked at %v", r.Key, r.LeaseExpiresAt, r.LockedAt)
				}
			}
			want := []string{short.Key, kept.Key, long.Key}
			if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Fatalf("ListStale = %v, want %v: by lease deadline", got, want)
			}
			if !stale[1].Uncertain || stale[0].Uncertain || stale[2].Uncertain {
				t.Fatalf("Uncertain marks %v %v %v, want only the kept record's", stale[0].Uncertain, stale[1].Uncertain, stale[2].Uncertain)
			}
			if one, err := s.ListStale(ctx, 1); err != nil || len(one) != 1 || one[0].Key != short.Key {
				t.Fatalf("ListStale(1) = %+v, %v; want %s", one, err, short.Key)
			}

			// The takeover Reconcile asks for gives the kept record a new
			// deadline, and the index follows.
			ask := claimReq("alice", kept.Key, "body", time.Hour)
			ask.TakeOverUncertain = true
			if res, err := s.Claim(ctx, ask); err != nil || !res.Reclaimed || !res.Record.Uncertain {
				t.Fatalf("takeover of the kept record: %+v, %v", res, err)
			}
			stale, err = s.ListStale(ctx, 100)
			mustNil(t, err)
			if len(stale) != 2 || stale[0].Key != short.Key || stale[1].Key != long.Key {
				t.Fatalf("after the takeover ListStale = %+v, want [%s %s]", stale, short.Key, long.Key)
			}
		})
	}
}
