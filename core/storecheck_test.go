package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// checkedStore is a memstore with a Check, as every database store has:
// Check returns err, or, when block is set, waits for its context to end
// (at most 10s) and returns the context's error. It counts its calls and
// records how long their context had left.
type checkedStore struct {
	*memstore.Store
	err      error
	block    bool
	calls    atomic.Int32
	deadline atomic.Int64 // the time left before the last call's deadline, in nanoseconds; -1 without one
}

func (s *checkedStore) Check(ctx context.Context) error {
	s.calls.Add(1)
	left := int64(-1)
	if d, ok := ctx.Deadline(); ok {
		left = int64(time.Until(d))
	}
	s.deadline.Store(left)
	if s.block {
		select {
		case <-ctx.Done():
			return fmt.Errorf("fakestore: check: %w: %w", idemstore.ErrTransient, ctx.Err())
		case <-time.After(10 * time.Second):
			return errors.New("fakestore: check: not given up")
		}
	}
	return s.err
}

var (
	_ idemstore.Store   = (*checkedStore)(nil)
	_ idemstore.Checker = (*checkedStore)(nil)
)

var (
	errMissingTable = fmt.Errorf("fakestore: check: %w: table idem_keys does not exist", idem.ErrMisconfigured)
	errUnreachable  = fmt.Errorf("fakestore: check: %w: dial tcp 127.0.0.1:5432: connection refused", idemstore.ErrTransient)
	errOther        = errors.New("fakestore: check: the server closed the connection")
)

// New asks a store with a Check to check itself, once and within
// StoreTimeout: a misconfiguration fails New with the store's complaint,
// anything else is logged once at Warn and New succeeds. SkipStoreCheck
// keeps New away from the store, and a store without a Check (memstore)
// needs none.
func TestNewChecksTheStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		store  idemstore.Store // nil: a checkedStore returning err
		err    error
		skip   bool
		fails  bool  // New fails with ErrInvalidConfig and ErrMisconfigured
		calls  int32 // the Check calls New makes
		logged bool  // one Warn record naming the error
	}{
		{name: "store answers", calls: 1},
		{name: "misconfigured", err: errMissingTable, fails: true, calls: 1},
		{name: "unreachable", err: errUnreachable, calls: 1, logged: true},
		{name: "other error", err: errOther, calls: 1, logged: true},
		{name: "misconfigured, skipped", err: errMissingTable, skip: true},
		{name: "unreachable, skipped", err: errUnreachable, skip: true},
		{name: "memstore has no Check", store: memstore.MustNew()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := &checkedStore{Store: memstore.MustNew(), err: tc.err}
			store := tc.store
			if store == nil {
				store = fake
			}
			logs := &records{}
			eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store,
				StoreTimeout: 2 * time.Second, SkipStoreCheck: tc.skip, Logger: slog.New(logs)})
			if n := fake.calls.Load(); n != tc.calls {
				t.Errorf("Check called %d times, want %d", n, tc.calls)
			}
			if tc.calls > 0 {
				if left := time.Duration(fake.deadline.Load()); left <= 0 || left > 2*time.Second {
					t.Errorf("Check's context had %v left, want a deadline within StoreTimeout (2s)", left)
				}
			}
			if tc.fails {
				if eng != nil || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, idem.ErrMisconfigured) {
					t.Fatalf("New = %v, %v, want an error wrapping ErrInvalidConfig and ErrMisconfigured", eng, err)
				}
				for _, want := range []string{"table idem_keys does not exist", "run the store's Migrate, or apply its migration"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("New's error %q does not say %q", err, want)
					}
				}
			} else if err != nil || eng == nil {
				t.Fatalf("New = %v, %v, want an Engine", eng, err)
			}
			warned := logs.warnings()
			switch {
			case !tc.logged && len(warned) > 0:
				t.Errorf("logged %q, want nothing", warned)
			case tc.logged && (len(warned) != 1 || !strings.Contains(warned[0], tc.err.Error())):
				t.Errorf("logged %q, want one Warn record naming %q", warned, tc.err)
			}
		})
	}
}

// A Check that does not answer is given up after StoreTimeout: New logs it
// and returns the Engine, which then serves requests as usual.
func TestNewStoreCheckIsBounded(t *testing.T) {
	t.Parallel()
	fake := &checkedStore{Store: memstore.MustNew(), block: true}
	logs := &records{}
	start := time.Now()
	eng, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: fake,
		StoreTimeout: 50 * time.Millisecond, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("New took %v with StoreTimeout 50ms", took)
	}
	if warned := logs.warnings(); len(warned) != 1 || !strings.Contains(warned[0], context.DeadlineExceeded.Error()) {
		t.Fatalf("logged %q, want one Warn record naming the deadline", warned)
	}
	att, resp := eng.Begin(context.Background(), request("alice", "k1"))
	if resp != nil || att == nil {
		t.Fatalf("Begin after a failed check = %v, %+v, want a claim", att, resp)
	}
	att.Abort()
}

// Without a Config.Logger the warning goes to slog.Default(). It sets
// slog's default logger, so it does not run in parallel.
func TestNewStoreCheckWarnsWithoutALogger(t *testing.T) {
	def := &records{}
	prev := slog.Default()
	slog.SetDefault(slog.New(def))
	t.Cleanup(func() { slog.SetDefault(prev) })
	fake := &checkedStore{Store: memstore.MustNew(), err: errUnreachable}
	if _, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: fake}); err != nil {
		t.Fatal(err)
	}
	if warned := def.warnings(); len(warned) != 1 || !strings.Contains(warned[0], errUnreachable.Error()) {
		t.Fatalf("slog.Default got %q, want one Warn record naming %q", warned, errUnreachable)
	}
}

// warnings returns the Warn records, each as its message followed by its
// attributes' values.
func (h *records) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level != slog.LevelWarn {
			continue
		}
		line := r.Message
		r.Attrs(func(a slog.Attr) bool {
			line += " " + a.Value.String()
			return true
		})
		out = append(out, line)
	}
	return out
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
