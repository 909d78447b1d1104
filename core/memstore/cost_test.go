package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// TestRecordCost: what a settled record costs the heap, measured at
// 100,000 records with benchmark-sized fields (a UUID key, a 32-byte
// fingerprint, a 35-byte body and two headers), and what the store counts
// it as against WithMaxBytes: the count may not fall short of the heap by
// more than a tenth, or WithMaxBytes would let the store take more memory
// than it says.
func TestRecordCost(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 100,000 records")
	}
	const n = 100_000
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memstore.MustNew(memstore.WithMaxRecords(n), memstore.WithPrincipalShare(1))
	for i := range n {
		req := benchClaim("0192f1c4-7a6e-7c3b-9d2e-" + strconv.FormatInt(1e11+int64(i), 10))
		req.Principal = "acct_" + strconv.Itoa(i%1000)
		req.Retention = time.Hour
		if _, err := s.Claim(ctx, req); err != nil {
			t.Fatal(err)
		}
		_, tx, err := s.BeginTx(ctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Settle(ctx, idemstore.Outcome{State: idemstore.StateCompleted, Response: benchResponse}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc-before.HeapAlloc) / n
	counted := float64(s.Bytes()) / n
	t.Logf("per record at %d records: heap %.0f B, counted %.0f B", n, heap, counted)
	if counted < 0.9*heap {
		t.Errorf("a record costs %.0f B of heap and is counted as %.0f B", heap, counted)
	}
	runtime.KeepAlive(s)
}
