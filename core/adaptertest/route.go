package adaptertest

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	idem "github.com/idemgo/idem/core"
)

// testRouteTemplate proves that the adapter fills Event.Route with the
// template of the route that matched, the same for every concrete path it
// serves and for a claim and its replay, never the path or the query: a
// metric labelled by it has the application's cardinality, not the
// clients'. The middleware sits on the group's parameter route
// (/payments/*rest, /payments/*, /payments/{rest...}), where Fiber's
// c.Route() still names the group's middleware mount and Gin's FullPath
// must include the group's prefix.
func testRouteTemplate(t *testing.T, s *suite) {
	var mu sync.Mutex
	var events []idem.Event
	cfg := s.config()
	cfg.Observer = idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})
	p := &payments{b: s.b}
	base := s.serve(t, cfg, p.handle)
	for _, rq := range []struct{ path, key string }{
		{"/payments/pay-4111?card=4111", "k-route-1"},
		{"/payments/pay-4242/capture?card=4242", "k-route-2"},
		{"/payments/pay-4111?card=4111", "k-route-1"}, // the replay
	} {
		r := Send(t, http.MethodPost, base+rq.path, "alice", rq.key, paymentBody)
		WantStatus(t, rq.path, r, http.StatusCreated)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 {
		t.Fatalf("%d events, want 3", len(events))
	}
	route := events[0].Route
	for i, ev := range events {
		if !strings.HasPrefix(ev.Path, "/payments/pay-") {
			t.Errorf("event %d: Path %q, want the concrete path", i, ev.Path)
		}
		if ev.Route == "" || ev.Route != route {
			t.Errorf("event %d (%s): Route %q, want the one route template %q", i, ev.Outcome, ev.Route, route)
		}
		for _, concrete := range []string{"pay-", "4111", "4242", "capture", "?"} {
			if strings.Contains(ev.Route, concrete) {
				t.Errorf("event %d: Route %q holds %q from the request, want the template", i, ev.Route, concrete)
			}
		}
	}
	// The parameter route below the group, not the group's mount
	// ("/payments", what Fiber's c.Route() says in group middleware).
	if _, pattern, _ := strings.Cut(route, " "); !strings.HasPrefix(route, "/payments/") && !strings.HasPrefix(pattern, "/payments/") {
		t.Errorf("Route %q is not the parameter route below /payments", route)
	}
	if events[2].Outcome != idem.OutcomeReplayed {
		t.Errorf("third event %s, want a replay", events[2].Outcome)
	}
}
