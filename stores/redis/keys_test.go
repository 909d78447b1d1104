package idemredis_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

// pairs are (principal, key) pairs that a careless key layout would
// confuse: separators, escapes, braces (Cluster hash tags), spaces, UTF-8.
var pairs = [][2]string{
	{"a", "b:c"}, {"a:b", "c"}, {"a%3Ab", "c"}, {"a", "b%3Ac"}, {"a%", "3Ab:c"},
	{"{x}", "k"}, {"x", "{k}"}, {"}", "{"}, {"{", "}"}, {"a b", "c"}, {"a\nb", "c"},
	{"é", "k"}, {"\xc3", "\xa9k"}, {"a", ""}, {"", "a"}, {"%", "%"}, {"%25", ""},
	{strings.Repeat("é", 127) + "p", strings.Repeat("k", 255)},
}

// TestKeyNamesAreInjective: no two (principal, key) pairs share a record
// key, and the index member names its pair back.
func TestKeyNamesAreInjective(t *testing.T) {
	s, err := idemredis.New(redis.NewClient(&redis.Options{Addr: idemredistest.Addr()}), idemredis.WithPrefix("p:"))
	mustNil(t, err)
	seen := map[string][2]string{}
	for _, p := range pairs {
		rec, idx, member := s.KeysFor(p[0], p[1])
		if other, dup := seen[rec]; dup {
			t.Fatalf("%q and %q share the record key %q", p, other, rec)
		}
		seen[rec] = p
		if rec != s.RecordKey(p[0], p[1]) {
			t.Fatalf("RecordKey differs from the store's key for %q", p)
		}
		principal, key, err := idemredis.SplitMember(member)
		if err != nil || principal != p[0] || key != p[1] {
			t.Fatalf("member %q names (%q, %q), %v; want %q", member, principal, key, err, p)
		}
		// The hash tag is the store's: the first '{' is the one after the
		// prefix, and the record and its index carry the same tag.
		tag := rec[strings.IndexByte(rec, '{') : strings.IndexByte(rec, '}')+1]
		if !strings.HasPrefix(rec, "p:"+tag) || !strings.HasPrefix(idx, "p:"+tag) {
			t.Fatalf("record %q and index %q do not start with the prefix and one hash tag %q", rec, idx, tag)
		}
		if strings.Count(member, ":") != 1 || strings.ContainsAny(member, "{} \n") {
			t.Fatalf("member %q holds an unescaped separator or brace", member)
		}
	}
}

// TestKeysShareASlot asks the Cluster itself (CLUSTER KEYSLOT) that every
// record key and its index key hash to one slot, and that the records
// spread over every primary.
func TestKeysShareASlot(t *testing.T) {
	ctx := testCtx(t)
	c := idemredistest.NewClusterClient(t)
	s, err := idemredis.New(c)
	mustNil(t, err)
	all := append([][2]string(nil), pairs...)
	for range 300 {
		all = append(all, [2]string{"acct_" + idemredistest.RandHex(3), idemredistest.RandHex(8)})
	}
	type slots struct{ rec, idx *redis.IntCmd }
	var got []slots
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, pr := range all {
			rec, idx, _ := s.KeysFor(pr[0], pr[1])
			got = append(got, slots{p.ClusterKeySlot(ctx, rec), p.ClusterKeySlot(ctx, idx)})
		}
		return nil
	})
	mustNil(t, err)
	nodes := map[string]bool{}
	for i, g := range got {
		if g.rec.Val() != g.idx.Val() {
			rec, idx, _ := s.KeysFor(all[i][0], all[i][1])
			t.Fatalf("record %q is in slot %d, its index %q in slot %d", rec, g.rec.Val(), idx, g.idx.Val())
		}
		rec, _, _ := s.KeysFor(all[i][0], all[i][1])
		n, err := c.MasterForKey(ctx, rec)
		mustNil(t, err)
		nodes[n.Options().Addr] = true
	}
	if len(nodes) != len(idemredistest.ClusterAddrs()) {
		t.Fatalf("%d records landed on %d primaries of %d", len(all), len(nodes), len(idemredistest.ClusterAddrs()))
	}
	t.Logf("%d pairs: record and index in one slot each, spread over %d primaries", len(all), len(nodes))
}

// TestIndexHoldsOnlyInProgress: the in-progress index has exactly the
// records in progress, kept ones included; settle and release take theirs
// out in the same script, and ListStale removes the entry of a record that
// expired in progress.
func TestIndexHoldsOnlyInProgress(t *testing.T) {
	ctx := testCtx(t)
	env := newEnv(t)
	s, c := env.Store, env.Client
	indexed := func(keys []string) int64 {
		t.Helper()
		var n int64
		for _, k := range keys {
			_, idx, member := s.KeysFor("alice", k)
			if _, err := c.ZScore(ctx, idx, member).Result(); err == nil {
				n++
			}
		}
		return n
	}
	var all []string
	for i := range 20 {
		req := claimReq("alice", "ix-"+idemredistest.RandHex(4), "body", time.Hour)
		if i == 19 {
			// Expires in progress, after its lease ended: ListStale
			// reaches an entry once its lease deadline passed.
			req.Lease, req.Retention = 20*time.Millisecond, 50*time.Millisecond
		}
		_, err := s.Claim(ctx, req)
		mustNil(t, err)
		all = append(all, req.Key)
		switch {
		case i < 10:
			_, tx, _ := s.BeginTx(ctx, leaseOf(req))
			mustNil(t, tx.Settle(ctx, okOutcome("{}")))
		case i < 15:
			mustNil(t, s.Release(ctx, leaseOf(req)))
		case i == 15:
			mustNil(t, s.Keep(ctx, leaseOf(req))) // still in progress
		}
	}
	if n := indexed(all); n != 5 {
		t.Fatalf("%d index entries for 5 records in progress (and one about to expire), want 5", n)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := s.ListStale(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if n := indexed(all); n != 4 {
		t.Fatalf("%d index entries after ListStale met the expired record, want 4", n)
	}
}
