package adaptertest

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// keepOnce is a Store whose first Release keeps the claim instead
// (Store.Keep), as the engine does for an attempt whose work may have
// committed without its outcome.
type keepOnce struct {
	idemstore.Store
	kept atomic.Bool
}

func (s *keepOnce) Release(ctx context.Context, l idemstore.Lease) error {
	if s.kept.CompareAndSwap(false, true) {
		return s.Store.Keep(ctx, l)
	}
	return s.Store.Release(ctx, l)
}

// testUncertainIs409: a key whose outcome is unknown (kept Uncertain) and
// no Config.Reconcile to ask is answered 409 outcome-unknown by every
// adapter, with no Retry-After, and its handler does not run again.
func testUncertainIs409(t *testing.T, s *suite) {
	var runs atomic.Int64
	cfg := s.config()
	cfg.Store = &keepOnce{Store: s.b.Store}
	base := s.serve(t, cfg, func(ctx context.Context, r Request) Reply {
		runs.Add(1)
		return Reply{Status: http.StatusServiceUnavailable, Body: []byte(`{"error":"provider timed out"}`)}
	})
	WantStatus(t, "first attempt", send(t, base, "alice", "k-uncertain", paymentBody), http.StatusServiceUnavailable)
	for _, what := range []string{"retry", "second retry"} {
		r := send(t, base, "alice", "k-uncertain", paymentBody)
		WantProblem(t, what, r, http.StatusConflict, idem.ProblemOutcomeUnknown)
		if ra := r.Header.Get("Retry-After"); ra != "" {
			t.Fatalf("%s: Retry-After %q on an outcome only an operator can resolve", what, ra)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once", n)
	}
}
