package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t testing.TB) storetest.Backend { return storetest.MemBackend(t) })
}

func TestBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	s := memstore.MustNew(memstore.WithMaxRecords(3), memstore.WithPrincipalShare(1), memstore.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	claim := func(key string, retention time.Duration) error {
		_, err := s.Claim(ctx, idemstore.ClaimRequest{Principal: "p", Key: key, Token: key, Lease: time.Minute, Retention: retention})
		return err
	}
	for _, k := range []string{"a", "b"} {
		if err := claim(k, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := claim("c", time.Hour); err != nil {
		t.Fatal(err)
	}
	err := claim("d", time.Hour)
	if !errors.Is(err, idemstore.ErrTransient) || !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("claim on a full store = %v, want ErrFull wrapped as transient", err)
	}
	if s.Len() != 3 {
		t.Fatalf("full store grew to %d records", s.Len())
	}
	now = now.Add(2 * time.Second) // a and b expire
	if err := claim("d", time.Hour); err != nil {
		t.Fatalf("claim after records expired: %v", err)
	}
	if s.Len() > 3 {
		t.Fatalf("store holds %d records, bound is 3", s.Len())
	}
}

// clock is a settable store clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newClocked() (*memstore.Store, *clock) {
	clk := &clock{now: time.Unix(1_700_000_000, 123)}
	return memstore.MustNew(memstore.WithClock(clk.Now)), clk
}

func claim(t testing.TB, s *memstore.Store, req idemstore.ClaimRequest) idemstore.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), req)
	if err != nil {
		t.Fatalf("Claim(%s): %v", req.Key, err)
	}
	return res
}

func settle(t testing.TB, s *memstore.Store, req idemstore.ClaimRequest, resp idem.Response) {
	t.Helper()
	ctx := context.Background()
	_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: resp}); err != nil {
		t.Fatalf("Settle(%s): %v", req.Key, err)
	}
}

// TestClock checks that leases, expiry and the record's times follow the
// store's clock.
func TestClock(t *testing.T) {
	t.Parallel()
	s, clk := newClocked()
	start := clk.now
	req := func(token string) idemstore.ClaimRequest {
		return idemstore.ClaimRequest{Principal: "p", Key: "k", Fingerprint: []byte("fp"), Token: token,
			RequestID: "r-" + token, Lease: time.Minute, Retention: time.Hour}
	}
	check := func(res idemstore.ClaimResult, claimed, reclaimed bool, token string, created, locked time.Time) {
		t.Helper()
		rec := res.Record
		if res.Claimed != claimed || res.Reclaimed != reclaimed || rec.LeaseToken != token || !res.Now.Equal(clk.now) ||
			!rec.CreatedAt.Equal(created) || !rec.LockedAt.Equal(locked) || !rec.ExpiresAt.Equal(locked.Add(time.Hour)) {
			t.Fatalf("at %v: claim = %+v, want claimed %v, reclaimed %v, token %s, created %v, locked %v",
				clk.now, res, claimed, reclaimed, token, created, locked)
		}
	}
	check(claim(t, s, req("a")), true, false, "a", start, start)
	clk.now = start.Add(time.Minute - 1)
	check(claim(t, s, req("b")), false, false, "a", start, start)
	clk.now = start.Add(time.Minute)
	check(claim(t, s, req("c")), true, true, "c", start, start.Add(time.Minute))
	locked := clk.now
	clk.now = locked.Add(time.Hour - 1)
	stale, err := s.ListStale(context.Background(), 10)
	if err != nil || len(stale) != 1 || stale[0].LeaseToken != "c" || !stale[0].LockedAt.Equal(locked) {
		t.Fatalf("ListStale = %+v, %v; want the record locked at %v", stale, err, locked)
	}
	other := req("d")
	other.Fingerprint = []byte("other")
	check(claim(t, s, other), false, false, "c", start, locked)
	clk.now = locked.Add(time.Hour)
	check(claim(t, s, other), true, false, "d", clk.now, clk.now)

	// A retention past the end of int64 nanoseconds saturates.
	forever := req("e")
	forever.Key, forever.Retention = "forever", time.Duration(math.MaxInt64)
	if rec := claim(t, s, forever).Record; !rec.ExpiresAt.After(clk.now.AddDate(200, 0, 0)) {
		t.Fatalf("a record kept forever expires at %v", rec.ExpiresAt)
	}
	if res := claim(t, s, forever); res.Claimed {
		t.Fatal("a record kept forever counted as expired")
	}
}

func benchClaim(key string) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{Principal: "acct_1", Key: key, Fingerprint: bytes.Repeat([]byte{7}, 32),
		Token: "0123456789abcdef0123456789abcdef", RequestID: "req-" + key, Lease: time.Minute, Retention: time.Hour}
}

var benchResponse = idem.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_1"}},
	Body:   []byte(`{"id":"pay_1","status":"succeeded"}`),
}

// BenchmarkFirstRequest claims a new key, begins a transaction and settles,
// with bounds that leave room for every request of the run.
func BenchmarkFirstRequest(b *testing.B) {
	s := memstore.MustNew(memstore.WithMaxRecords(b.N+1), memstore.WithMaxBytes(64<<30), memstore.WithPrincipalShare(1))
	ctx := context.Background()
	reqs := make([]idemstore.ClaimRequest, b.N)
	for i := range reqs {
		reqs[i] = benchClaim(strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, req := range reqs {
		if _, err := s.Claim(ctx, req); err != nil {
			b.Fatal(err)
		}
		_, tx, _ := s.BeginTx(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: benchResponse}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay claims a settled key.
func BenchmarkReplay(b *testing.B) {
	s := memstore.MustNew()
	req := benchClaim("k")
	claim(b, s, req)
	settle(b, s, req, benchResponse)
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Claim(context.Background(), req)
		if err != nil || res.Claimed || res.Record.Response == nil {
			b.Fatalf("replay claim = %+v, %v", res, err)
		}
	}
}

// TestNewRefusesInvalidOptions: New returns an error naming an option given
// a value it cannot use, rather than a store that misbehaves later.
func TestNewRefusesInvalidOptions(t *testing.T) {
	t.Parallel()
	for name, opt := range map[string]memstore.Option{
		"WithMaxRecords":     memstore.WithMaxRecords(0),
		"WithMaxBytes":       memstore.WithMaxBytes(-1),
		"WithPrincipalShare": memstore.WithPrincipalShare(1.5),
		"WithClock":          memstore.WithClock(nil),
	} {
		if s, err := memstore.New(opt); err == nil || s != nil || !strings.Contains(err.Error(), name) {
			t.Errorf("New(%s) = %v, %v; want no store and an error naming %s", name, s, err, name)
		}
	}
	if _, err := memstore.New(memstore.WithMaxRecords(1), memstore.WithPrincipalShare(1)); err != nil {
		t.Fatalf("New with valid options: %v", err)
	}
}
