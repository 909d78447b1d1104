package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
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
	s := memstore.New(memstore.WithMaxRecords(3), memstore.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	claim := func(key string, retention time.Duration) error {
		_, err := s.Claim(ctx, idem.ClaimRequest{Principal: "p", Key: key, Token: key, Lease: time.Minute, Retention: retention})
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
	if !errors.Is(err, idem.ErrTransient) || !errors.Is(err, memstore.ErrFull) {
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
