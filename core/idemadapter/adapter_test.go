package idemadapter_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

func TestNewAdapterValidates(t *testing.T) {
	t.Parallel()
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew()})
	if err != nil {
		t.Fatal(err)
	}
	principal := func(*http.Request) (string, error) { return "alice", nil }
	for _, tc := range []struct {
		name      string
		eng       *idem.Engine
		principal func(*http.Request) (string, error)
		want      string // "" when NewAdapter succeeds
	}{
		{"valid", eng, principal, ""},
		{"no engine", nil, principal, "idemtest: idem: invalid config: Engine is required"},
		{"no principal function", eng, nil, "idemtest: idem: invalid config: Principal is required"},
		{"neither", nil, nil, "idemtest: idem: invalid config: Engine is required (build it once with idem.New and share it); Principal is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := idemadapter.NewAdapter("idemtest", tc.eng, tc.principal)
			if tc.want == "" {
				if err != nil || a == nil || a.Engine != eng {
					t.Fatalf("NewAdapter = %v, %v, want an Adapter on the given Engine", a, err)
				}
				return
			}
			if !errors.Is(err, idem.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("NewAdapter error %q, want ErrInvalidConfig starting %q", err, tc.want)
			}
		})
	}
}

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (*records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h *records) WithGroup(string) slog.Handler          { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// find returns the records whose outcome attribute is outcome.
func (h *records) find(outcome idem.OutcomeLabel) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "outcome" && a.Value.String() == string(outcome) {
				out = append(out, r)
			}
			return true
		})
	}
	return out
}

// A principal function's error is answered 401 like a missing principal,
// but it reaches the Event and the log: without a Logger, through
// slog.Default at Warn; a missing principal alone is not logged. It sets
// slog's default logger, so it does not run in parallel.
func TestPrincipalErrorReachesEventAndLog(t *testing.T) {
	errAuth := errors.New("auth backend unreachable")
	for _, tc := range []struct {
		name        string
		principal   string
		err         error
		keyOptional bool
		key         string
		logger      bool // Config.Logger set, instead of slog.Default
		status      int  // 0: the handler runs unbuffered
		outcome     idem.OutcomeLabel
		logged      bool // a Warn record for the outcome
	}{
		{"principal error", "alice", errAuth, false, "k", false, http.StatusUnauthorized, idem.OutcomeUnauthenticated, true},
		{"principal error with a Logger", "", errAuth, false, "k", true, http.StatusUnauthorized, idem.OutcomeUnauthenticated, true},
		// The first request without a principal (each case has its own
		// engine) is logged once: the middleware may run before auth.
		{"no principal, no error", "", nil, false, "k", false, http.StatusUnauthorized, idem.OutcomeUnauthenticated, true},
		{"principal error, optional key absent", "alice", errAuth, true, "", false, 0, idem.OutcomeNoKey, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def, own := &records{}, &records{}
			prev := slog.Default()
			slog.SetDefault(slog.New(def))
			t.Cleanup(func() { slog.SetDefault(prev) })
			var events []idem.Event
			cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), KeyOptional: tc.keyOptional,
				Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) { events = append(events, ev) })}
			if tc.logger {
				cfg.Logger = slog.New(own)
			}
			eng, err := idem.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a, err := idemadapter.NewAdapter("idemtest", eng, func(*http.Request) (string, error) { return tc.principal, tc.err })
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
			if tc.key != "" {
				r.Header.Set(idem.DefaultHeader, tc.key)
			}
			w := httptest.NewRecorder()
			ran := false
			a.HandleHTTP(r, w, r, func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
				ran = buf == nil && r2 == r
				return nil
			})
			if tc.status == 0 {
				if !ran {
					t.Fatalf("the handler did not run unbuffered: %d %s", w.Code, w.Body)
				}
			} else if ran || w.Code != tc.status {
				t.Fatalf("got %d (handler ran: %v), want %d", w.Code, ran, tc.status)
			}
			if len(events) != 1 || events[0].Outcome != tc.outcome {
				t.Fatalf("events %+v, want one %s", events, tc.outcome)
			}
			var wantErr error // the principal function's, on a 401
			if tc.outcome == idem.OutcomeUnauthenticated {
				wantErr = tc.err
			}
			if got := events[0].Err; got != wantErr {
				t.Fatalf("event Err %v, want %v", got, wantErr)
			}
			logs := def
			if tc.logger {
				logs = own
			}
			got := logs.find(tc.outcome)
			if !tc.logged {
				if len(got) != 0 {
					t.Fatalf("logged %v", got)
				}
				return
			}
			if len(got) != 1 || got[0].Level != slog.LevelWarn {
				t.Fatalf("records %v, want one at Warn", got)
			}
			var logged string
			got[0].Attrs(func(a slog.Attr) bool {
				if a.Key == "error" {
					logged = a.Value.String()
				}
				return true
			})
			if want := fmt.Sprint(tc.err); tc.err != nil && logged != want {
				t.Fatalf("logged error %q, want %q", logged, want)
			}
			if tc.err == nil && !strings.Contains(got[0].Message, "place it after") {
				t.Fatalf("logged %q, want the hint that the middleware may run before auth", got[0].Message)
			}
		})
	}
}
