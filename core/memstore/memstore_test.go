package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
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

// sameResponse reports whether got holds want, in a header map the caller
// can add to.
func sameResponse(got, want *idem.Response) bool {
	if got == nil || got.Status != want.Status || !bytes.Equal(got.Body, want.Body) ||
		got.Header == nil || len(got.Header) != len(want.Header) {
		return false
	}
	for name, vs := range want.Header {
		if g, ok := got.Header[name]; !ok || !slices.Equal(g, vs) {
			return false
		}
	}
	return true
}

// TestResponseEncoding settles responses of every shape and reads them back
// through Get and through a Claim that finds the record, changing each read
// the way a caller may before reading again.
func TestResponseEncoding(t *testing.T) {
	t.Parallel()
	binary := make([]byte, 1024)
	for i := range binary {
		binary[i] = byte(i * 7)
	}
	long := strings.Repeat("väl", 100) // longer than one uvarint byte counts
	many := http.Header{}
	for i := range 40 {
		many[fmt.Sprintf("X-H%d", i)] = []string{strconv.Itoa(i)}
	}
	tests := []struct {
		name        string
		fingerprint []byte
		resp        idem.Response
	}{
		{"several values", []byte("fp"), idem.Response{Status: 201, Header: http.Header{
			"Content-Type":  {"application/json"},
			"Cache-Control": {"no-store", "private"},
			"Set-Cookie":    {"a=1", "b=2", "c=3"},
		}, Body: []byte(`{"id":"1"}`)}},
		{"empty header value", []byte("fp"), idem.Response{Status: 200, Header: http.Header{"X-Empty": {""}, "X-Also": {"", "x", ""}}, Body: []byte("ok")}},
		{"header without values", []byte("fp"), idem.Response{Status: 200, Header: http.Header{"X-None": {}, "X-One": {"1"}}}},
		{"nil header", []byte("fp"), idem.Response{Status: 204}},
		{"empty header", []byte("fp"), idem.Response{Status: 204, Header: http.Header{}, Body: []byte{}}},
		{"empty body", []byte("fp"), idem.Response{Status: 202, Header: http.Header{"Location": {"/x"}}, Body: []byte{}}},
		{"binary body", []byte{0, 0x80, 0xff}, idem.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: binary}},
		{"long fields", bytes.Repeat([]byte{0x80}, 200), idem.Response{Status: 299, Header: http.Header{long: {long, long}}, Body: bytes.Repeat(binary, 300)}},
		{"many headers", []byte("fp"), idem.Response{Status: 400, Header: many, Body: []byte(`{"title":"bad"}`)}},
		{"odd status", nil, idem.Response{Status: 0x7fff_ffff}},
		{"negative status", []byte("fp"), idem.Response{Status: -1}},
	}
	s := memstore.MustNew()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := idemstore.ClaimRequest{Principal: "p", Key: tc.name, Fingerprint: tc.fingerprint, Token: "tok-" + tc.name,
				RequestID: "req-" + tc.name, Lease: time.Minute, Retention: time.Hour}
			claim(t, s, req)
			// The store must keep its own copy of what Settle is given.
			sent := idem.Response{Status: tc.resp.Status, Header: tc.resp.Header.Clone(), Body: bytes.Clone(tc.resp.Body)}
			settle(t, s, req, sent)
			for _, vs := range sent.Header {
				if len(vs) > 0 {
					vs[0] = "scribbled"
				}
			}
			clear(sent.Body)

			reads := map[string]func() idem.Record{
				"Get": func() idem.Record {
					rec, err := s.Get(context.Background(), "p", tc.name)
					if err != nil {
						t.Fatal(err)
					}
					return rec
				},
				"Claim": func() idem.Record {
					again := req
					again.Token = "other"
					res := claim(t, s, again)
					if res.Claimed {
						t.Fatal("a settled record was claimed again")
					}
					return res.Record
				},
			}
			for range 2 {
				for how, read := range reads {
					rec := read()
					if !sameResponse(rec.Response, &tc.resp) {
						t.Fatalf("%s: response = %+v, want %+v", how, rec.Response, tc.resp)
					}
					if !bytes.Equal(rec.Fingerprint, tc.fingerprint) || rec.LeaseToken != req.Token ||
						rec.RequestID != req.RequestID || rec.State != idemstore.StateCompleted {
						t.Fatalf("%s: record = %+v, want the claim's fingerprint, token and request id", how, rec)
					}
					scribble(t, &rec)
				}
			}
		})
	}
}

// scribble changes rec in every way a caller may, checking that appending to
// one header's values leaves the others alone and appending to the
// fingerprint leaves the body alone.
func scribble(t *testing.T, rec *idem.Record) {
	t.Helper()
	h := rec.Response.Header
	for name := range h {
		before := h.Clone()
		h[name] = append(h[name], "appended")
		for other, vs := range before {
			if other != name && !slices.Equal(h[other], vs) {
				t.Fatalf("appending to %s changed %s to %q", name, other, h[other])
			}
		}
		h[name][0] = "changed"
	}
	h["X-Caller"] = []string{"x"}
	body := bytes.Clone(rec.Response.Body)
	rec.Fingerprint = append(rec.Fingerprint, 1, 2, 3)
	if !bytes.Equal(rec.Response.Body, body) {
		t.Fatal("appending to the fingerprint changed the body")
	}
	for i := range rec.Fingerprint {
		rec.Fingerprint[i] ^= 0xff
	}
	for i := range rec.Response.Body {
		rec.Response.Body[i] ^= 0xff
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

// TestListStaleOrder checks that ListStale returns the oldest leases first
// and at most limit of them.
func TestListStaleOrder(t *testing.T) {
	t.Parallel()
	s, clk := newClocked()
	start := clk.now
	for i, key := range []string{"c", "a", "d", "b"} {
		clk.now = start.Add(time.Duration(i) * time.Second)
		claim(t, s, idemstore.ClaimRequest{Principal: "p", Key: key, Token: key, Lease: time.Minute, Retention: time.Hour})
	}
	settle(t, s, idemstore.ClaimRequest{Principal: "p", Key: "d", Token: "d"}, idem.Response{Status: 200})
	clk.now = start.Add(time.Hour - time.Second)
	stale, err := s.ListStale(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range stale {
		keys = append(keys, r.Key)
	}
	if !slices.Equal(keys, []string{"c", "a"}) {
		t.Fatalf("ListStale(limit 2) = %v, want [c a]", keys)
	}
}

type ctxKey struct{}

// TestTxContext checks the context BeginTx returns: it carries the
// transaction to contexts derived from it, and its parent's values and
// cancellation.
func TestTxContext(t *testing.T) {
	t.Parallel()
	s := memstore.MustNew()
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	txCtx, tx, err := s.BeginTx(parent, idemstore.Lease{Principal: "p", Key: "k", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	child, cancelChild := context.WithCancel(txCtx)
	defer cancelChild()
	for _, ctx := range []context.Context{txCtx, child} {
		got, ok := memstore.Tx(ctx)
		if !ok {
			t.Fatal("Tx found no transaction")
		}
		if got.OnCommit(func() {}); !tx.Used() {
			t.Fatal("work added through Tx's handle is not the transaction BeginTx returned")
		}
		if ctx.Value(ctxKey{}) != "v" {
			t.Fatal("the transaction's context lost its parent's value")
		}
	}
	if _, ok := memstore.Tx(parent); ok {
		t.Fatal("Tx found a transaction in the parent")
	}
	cancel()
	<-child.Done()
	if !errors.Is(txCtx.Err(), context.Canceled) {
		t.Fatalf("after the parent was cancelled the transaction's context has %v", txCtx.Err())
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

// BenchmarkFirstRequest claims a new key, begins a transaction and settles.
func BenchmarkFirstRequest(b *testing.B) {
	s := memstore.MustNew(memstore.WithMaxRecords(b.N+1), memstore.WithPrincipalShare(1))
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
