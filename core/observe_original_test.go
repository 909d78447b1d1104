package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestEventOriginalRequestID: a replay's Event carries the request id the
// original attempt stored; no other outcome does.
func TestEventOriginalRequestID(t *testing.T) {
	var (
		mu     sync.Mutex
		events []idem.Event
	)
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	})})
	if err != nil {
		t.Fatal(err)
	}
	send := func(id, body string) {
		att, _ := e.Begin(context.Background(), idem.Request{Method: "POST", Path: "/p", Principal: "acct", Key: "k",
			RequestID: id, Body: strings.NewReader(body)})
		if att != nil {
			att.Finish(idem.Result{Status: http.StatusCreated})
		}
	}
	send("req-1", "a") // claimed
	send("req-2", "a") // replayed
	send("req-3", "b") // fingerprint mismatch
	for i, want := range []struct {
		outcome  idem.OutcomeLabel
		original string
	}{{idem.OutcomeClaimed, ""}, {idem.OutcomeReplayed, "req-1"}, {idem.OutcomeFingerprintMismatch, ""}} {
		if ev := events[i]; ev.Outcome != want.outcome || ev.OriginalRequestID != want.original || ev.RequestID != "req-"+string(rune('1'+i)) {
			t.Errorf("event %d: %s, request id %q, original %q; want %s, original %q", i, ev.Outcome, ev.RequestID, ev.OriginalRequestID, want.outcome, want.original)
		}
	}
}

// TestKeyHashMatchesTheLog: KeyHash is the key_hash of the engine's log
// line, so an observer's export correlates with the log.
func TestKeyHashMatchesTheLog(t *testing.T) {
	var buf bytes.Buffer
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	att, _ := e.Begin(context.Background(), idem.Request{Method: "POST", Path: "/p", Principal: "acct", Key: "secret-key"})
	att.Finish(idem.Result{Status: http.StatusCreated})
	h := idem.KeyHash("acct", "secret-key")
	if !strings.Contains(buf.String(), "key_hash="+h) || strings.Contains(buf.String(), "secret-key") {
		t.Errorf("KeyHash = %s; log: %s", h, buf.String())
	}
	if h == idem.KeyHash("acct2", "secret-key") {
		t.Error("KeyHash ignores the principal")
	}
}
