package adaptertest

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemgo/idem/core/idemstore"
)

// taintedStore plays a record stored before Finish checked header values:
// every record a claim returns for replay carries a Location value with a
// CR LF and a Set-Cookie line after it.
type taintedStore struct{ idemstore.Store }

const taintedLocation = "/ok\r\nSet-Cookie: stolen=1"

func (s taintedStore) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && !res.Claimed && res.Record.Response != nil {
		if res.Record.Response.Header == nil {
			res.Record.Response.Header = http.Header{}
		}
		res.Record.Response.Header["Location"] = []string{taintedLocation}
		res.Record.Response.Header["Bad Name\r\nSet-Cookie"] = []string{"stolen=2"}
	}
	return res, err
}

// testReplayedHeadersValidated: a stored header whose name or value is not
// valid HTTP never reaches the wire at replay, whatever the framework does
// with values (fasthttp writes them raw): no Set-Cookie line appears, and
// the rest of the replay is sent.
func testReplayedHeadersValidated(t *testing.T, s *suite) {
	p := &payments{b: s.b}
	cfg := s.config()
	cfg.Store = taintedStore{cfg.Store}
	base := s.serve(t, cfg, p.handle)
	first := send(t, base, "alice", "k-tainted", paymentBody)
	WantStatus(t, "first", first, http.StatusCreated)
	replay := send(t, base, "alice", "k-tainted", paymentBody)
	WantStatus(t, "replay", replay, http.StatusCreated)
	if !replay.Replayed() {
		t.Fatalf("second response is not a replay: %+v", replay.Header)
	}
	if c := replay.Header.Values("Set-Cookie"); len(c) > 0 {
		t.Fatalf("a stored header value split the replay into a Set-Cookie line: %q", c)
	}
	if string(replay.Body) != string(first.Body) {
		t.Fatalf("replayed body %q, want %q", replay.Body, first.Body)
	}
}
