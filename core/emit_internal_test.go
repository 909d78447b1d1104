package idem

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestEmitBuildsNoLineBelowTheLevel: a request whose line the logger
// leaves out (INFO under a WARN logger) costs no allocation, while the
// lines it writes keep their attributes.
func TestEmitBuildsNoLineBelowTheLevel(t *testing.T) {
	var out strings.Builder
	e := &Engine{cfg: Config{Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
	ctx := context.Background()
	ev := Event{Outcome: OutcomeReplayed, Method: "POST", Path: "/payments?card=1", Status: 201,
		Duration: time.Millisecond, Principal: "alice", Key: "k-1", RequestID: "req-1", ClaimLatency: time.Microsecond,
		TxUsed: true}
	if n := testing.AllocsPerRun(100, func() { e.emit(ctx, ev) }); n != 0 {
		t.Errorf("an INFO line under a WARN logger: %v allocations per request, want 0", n)
	}
	if out.Len() != 0 {
		t.Errorf("an INFO line under a WARN logger was written: %s", out.String())
	}

	ev.Outcome, ev.Err = OutcomeStoreError, errors.New("store down")
	e.emit(ctx, ev)
	for _, want := range []string{"level=ERROR", "outcome=store_error", "path=/payments ", "key_hash=", "request_id=req-1", `error="store down"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the ERROR line %q lacks %q", out.String(), want)
		}
	}
}

// BenchmarkEmitBelowLevel is what a request's INFO line costs when the
// logger leaves it out.
func BenchmarkEmitBelowLevel(b *testing.B) {
	e := &Engine{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
	ev := Event{Outcome: OutcomeClaimed, Method: "POST", Path: "/payments", Status: 201, Duration: time.Millisecond,
		Principal: "alice", Key: "k-1", RequestID: "req-1", ClaimLatency: time.Microsecond, TxUsed: true}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		e.emit(ctx, ev)
	}
}
