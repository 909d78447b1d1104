package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestPrincipalShare: one principal filling its share of the records or of
// the bytes gets ErrFull; every other principal's claims and settles still
// succeed: 50 keys of one customer must not make every other customer's
// next request a 503.
func TestPrincipalShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("records", func(t *testing.T) {
		t.Parallel()
		s := memstore.MustNew(memstore.WithMaxRecords(50)) // default share: 5 records each
		e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: s})
		if err != nil {
			t.Fatal(err)
		}
		full := 0
		for i := range 50 {
			att, resp := e.Begin(ctx, idem.Request{Method: "POST", Path: "/p", Principal: "mallory",
				Key: fmt.Sprintf("k%d", i), Body: strings.NewReader("{}")})
			if att != nil {
				att.Finish(idem.Result{Status: http.StatusCreated})
				continue
			}
			if resp.Status != http.StatusServiceUnavailable {
				t.Fatalf("mallory's request %d: %d", i, resp.Status)
			}
			full++
		}
		if full != 45 {
			t.Fatalf("mallory was refused %d of 50, want 45 (her share is 5)", full)
		}
		for i := range 5 {
			att, resp := e.Begin(ctx, idem.Request{Method: "POST", Path: "/p", Principal: fmt.Sprintf("customer-%d", i),
				Key: "k", Body: strings.NewReader("{}")})
			if att == nil {
				t.Fatalf("customer-%d starved by mallory: %d %s", i, resp.Status, resp.Body)
			}
			att.Finish(idem.Result{Status: http.StatusCreated})
		}
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		s := memstore.MustNew(memstore.WithMaxBytes(1<<20), memstore.WithPrincipalShare(0.25))
		claim := func(principal, key string) (idemstore.Tx, error) {
			req := idemstore.ClaimRequest{Principal: principal, Key: key, Fingerprint: make([]byte, 32), Token: key,
				Lease: time.Minute, Retention: time.Hour}
			if _, err := s.Claim(ctx, req); err != nil {
				return nil, err
			}
			_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: principal, Key: key, Token: key})
			return tx, err
		}
		body := make([]byte, 100<<10)
		stored := 0
		var err error
		for i := range 10 {
			var tx idemstore.Tx
			if tx, err = claim("mallory", fmt.Sprint(i)); err == nil {
				err = tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 200, Body: body}})
			}
			if err != nil {
				break
			}
			stored++
		}
		if !errors.Is(err, memstore.ErrFull) || !errors.Is(err, idemstore.ErrTransient) || stored != 2 {
			t.Fatalf("mallory stored %d responses of 100 KiB in a 256 KiB share, then %v", stored, err)
		}
		tx, err := claim("bob", "k")
		if err == nil {
			err = tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{Status: 200, Body: body}})
		}
		if err != nil {
			t.Fatalf("bob starved by mallory's bytes: %v", err)
		}
	})
}

// TestMaxBytes: the store as a whole is bounded in bytes, whatever the
// share; an expired record's bytes are reclaimed.
func TestMaxBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	s := memstore.MustNew(memstore.WithMaxBytes(4<<10), memstore.WithPrincipalShare(1),
		memstore.WithClock(func() time.Time { return now }))
	id := strings.Repeat("r", 1000)
	// Each record under its own principal: only the store's own bound
	// applies.
	claim := func(key string, retention time.Duration) error {
		_, err := s.Claim(ctx, idemstore.ClaimRequest{Principal: "p" + key, Key: key, Token: key, Fingerprint: []byte(id),
			Lease: time.Minute, Retention: retention})
		return err
	}
	n := 0
	for ; n < 100; n++ {
		if err := claim(fmt.Sprint(n), time.Second); err != nil {
			if !errors.Is(err, memstore.ErrFull) {
				t.Fatal(err)
			}
			break
		}
	}
	if n == 0 || n > 4 {
		t.Fatalf("%d records of 1 KB fit in 4 KiB", n)
	}
	now = now.Add(2 * time.Second)
	if err := claim("after", time.Hour); err != nil {
		t.Fatalf("expired records' bytes were not reclaimed: %v", err)
	}
}

// TestReclaimKeepsCounts: a key claimed again over its released record
// replaces the record, so the store's counts of records and bytes stay
// where they were, and a principal can reuse one key without filling its
// share.
func TestReclaimKeepsCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memstore.MustNew(memstore.WithMaxRecords(10)) // a share of 1 record
	req := idemstore.ClaimRequest{Principal: "alice", Key: "k", Fingerprint: []byte("fp"), Token: "t0",
		Nonce: "n", Lease: time.Minute, Retention: time.Hour}
	var bytes int64
	for i := range 5 {
		req.Token = fmt.Sprintf("t%d", i)
		res, err := s.Claim(ctx, req)
		if err != nil || !res.Claimed {
			t.Fatalf("claim %d: %v %+v", i, err, res)
		}
		if i == 0 {
			bytes = s.Bytes()
		} else if got := s.Bytes(); got != bytes {
			t.Fatalf("claim %d counts %d bytes, the first %d", i, got, bytes)
		}
		if err := s.Release(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != 1 {
		t.Fatalf("%d records, want 1", s.Len())
	}
}
