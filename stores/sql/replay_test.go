package idemsql_test

import (
	"testing"
	"time"

	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// TestReplayWritesNothingPostgres: the row's system columns prove that no
// replay locked or rewrote it (ON CONFLICT … DO UPDATE … WHERE false would
// set xmax to its own transaction id on every replay).
func TestReplayWritesNothingPostgres(t *testing.T) {
	f := idemsqltest.NewFixture(t, "pgx")
	ctx := testCtx(t)
	req := settledKey(t, f, "pgreplay-"+idemsqltest.RandSuffix())
	sys := func() string {
		var ctid, xmin, xmax string
		err := f.DB.QueryRow(`SELECT ctid::text, xmin::text, xmax::text FROM `+f.Store.Table()+` WHERE principal = $1 AND "key" = $2`,
			"alice", req.Key).Scan(&ctid, &xmin, &xmax)
		if err != nil {
			t.Fatal(err)
		}
		return ctid + " " + xmin + " " + xmax
	}
	before := sys()
	for range 50 {
		if res, err := f.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute)); err != nil || res.Claimed {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	if after := sys(); after != before {
		t.Fatalf("replays touched the row: (ctid xmin xmax) %s → %s", before, after)
	}
	t.Logf("50 replays: row (ctid xmin xmax) stayed %s", before)
}

// TestReplayWritesNothingSQLite: PRAGMA data_version, read on a connection
// of its own, changes whenever another connection commits a write. Replays
// must leave it alone.
func TestReplayWritesNothingSQLite(t *testing.T) {
	f := idemsqltest.NewFixture(t, "sqlite")
	ctx := testCtx(t)
	req := settledKey(t, f, "litereplay-"+idemsqltest.RandSuffix())
	observer, err := f.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	version := func() int64 {
		var v int64
		if err := observer.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := version()
	for range 50 {
		if res, err := f.Store.Claim(ctx, claimReq("alice", req.Key, "body", time.Minute)); err != nil || res.Claimed {
			t.Fatalf("replay: %+v %v", res, err)
		}
	}
	if after := version(); after != before {
		t.Fatalf("replays committed writes: data_version %d → %d", before, after)
	}
	// The observer does see a real write.
	if _, err := f.Store.Claim(ctx, claimReq("alice", "other-"+idemsqltest.RandSuffix(), "body", time.Minute)); err != nil {
		t.Fatal(err)
	}
	if after := version(); after == before {
		t.Fatal("data_version did not move for a real claim: the check proves nothing")
	}
}
