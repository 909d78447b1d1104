package idem_test

import (
	"context"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestAttemptContextThroughAFrameworkContext: a handler that passes the
// framework's own context finds the attempt (its lease, its downstream
// key, its store's transaction) once the adapter stored the attempt's
// context under ContextKey, and finds nothing, rather than something else,
// without it.
func TestAttemptContextThroughAFrameworkContext(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), request("alice", "k"))
	defer att.Abort()
	want, err := idem.DownstreamKey(att.Context(), "charge")
	if err != nil {
		t.Fatal(err)
	}

	bare := storetest.FrameworkContext(nil)
	if _, ok := idem.AttemptContext(bare); ok {
		t.Fatal("AttemptContext found an attempt in a context that carries none")
	}
	if _, err := idem.DownstreamKey(bare, "charge"); err != idem.ErrNoAttempt {
		t.Fatalf("DownstreamKey without an attempt: %v, want ErrNoAttempt", err)
	}
	if _, ok := memstore.Tx(bare); ok {
		t.Fatal("Tx found a transaction in a context that carries none")
	}

	stored := storetest.FrameworkContext(att)
	if ac, ok := idem.AttemptContext(stored); !ok || ac != att.Context() {
		t.Fatalf("AttemptContext = %v, %v; want the attempt's context", ac, ok)
	}
	if l, ok := idemadapter.LeaseFrom(stored); !ok || l != att.Lease() {
		t.Fatalf("LeaseFrom = %+v, %v; want %+v", l, ok, att.Lease())
	}
	if got, err := idem.DownstreamKey(stored, "charge"); err != nil || got != want {
		t.Fatalf("DownstreamKey = %q, %v; want %q", got, err, want)
	}
	if _, ok := memstore.Tx(stored); !ok {
		t.Fatal("Tx did not find the transaction through the framework's context")
	}
}
