package idem_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"net/http"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// gcmSealer is AES-256-GCM with the record's principal and key as
// additional data, a random nonce in front of the ciphertext.
type gcmSealer struct{ aead cipher.AEAD }

func newGCMSealer(t *testing.T) gcmSealer {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return gcmSealer{aead}
}

func (s gcmSealer) Seal(_ context.Context, principal, key string, body []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, body, []byte(principal+"\x00"+key)), nil
}

func (s gcmSealer) Open(_ context.Context, principal, key string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("sealed body too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], []byte(principal+"\x00"+key))
}

type failingSealer struct{ gcmSealer }

func (failingSealer) Seal(context.Context, string, string, []byte) ([]byte, error) {
	return nil, errors.New("kms unavailable")
}

const secretBody = `{"id":"pay_1","card":"4242 4242 4242 4242"}`

// runFirst claims alice's key k on e, answers 201 with secretBody and a
// Location, and returns what the client got.
func runFirst(t *testing.T, e *idem.Engine, key string) *idem.Response {
	t.Helper()
	att, resp := e.Begin(context.Background(), request("alice", key))
	if att == nil {
		t.Fatalf("no claim: %+v", resp)
	}
	return att.Finish(idem.Result{Status: http.StatusCreated,
		Header: http.Header{"Location": {"/payments/pay_1"}}, Body: []byte(secretBody)})
}

// TestOmitStoredBody: the store keeps status and headers only; the first
// response is whole, a replay sends the status and headers with no body.
func TestOmitStoredBody(t *testing.T) {
	t.Parallel()
	mem := memstore.MustNew()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: mem, OmitStoredBody: true})
	if err != nil {
		t.Fatal(err)
	}
	if first := runFirst(t, e, "k"); string(first.Body) != secretBody {
		t.Fatalf("first response body %q", first.Body)
	}
	rec, err := mem.Get(context.Background(), "alice", "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Response.Body) != 0 || rec.Response.Status != http.StatusCreated {
		t.Fatalf("stored %d %q, want 201 and no body", rec.Response.Status, rec.Response.Body)
	}
	_, replay := e.Begin(context.Background(), request("alice", "k"))
	if replay.Status != http.StatusCreated || len(replay.Body) != 0 ||
		replay.Header.Get("Location") != "/payments/pay_1" || replay.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("replay %d %v %q", replay.Status, replay.Header, replay.Body)
	}
}

// TestBodySealer: the stored body is sealed (its text is nowhere in the
// record) and a replay opens it; a body that does not open (sealed under
// another key) is answered 500 replay-unreadable, never sent as
// it is stored; a failing Seal rolls the request back and stores nothing.
func TestBodySealer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := memstore.MustNew()
	sealer := newGCMSealer(t)
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: mem, BodySealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	if first := runFirst(t, e, "k"); string(first.Body) != secretBody {
		t.Fatalf("first response body %q", first.Body)
	}
	rec, err := mem.Get(ctx, "alice", "k")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(rec.Response.Body, []byte("4242")) || len(rec.Response.Body) == 0 {
		t.Fatalf("stored body is not sealed: %q", rec.Response.Body)
	}
	if _, replay := e.Begin(ctx, request("alice", "k")); replay.Status != http.StatusCreated || string(replay.Body) != secretBody {
		t.Fatalf("replay %d %q", replay.Status, replay.Body)
	}

	var ev idem.Event
	other, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: mem, BodySealer: newGCMSealer(t),
		Observer: idem.ObserverFunc(func(_ context.Context, got idem.Event) { ev = got })})
	if err != nil {
		t.Fatal(err)
	}
	_, replay := other.Begin(ctx, request("alice", "k"))
	if replay.Status != http.StatusInternalServerError || !jsonHasType(replay.Body, idem.ProblemReplayUnreadable) ||
		bytes.Equal(replay.Body, rec.Response.Body) {
		t.Fatalf("replay under another key: %d %q", replay.Status, replay.Body)
	}
	if ev.Outcome != idem.OutcomeReplayUnreadable || !errors.Is(ev.Err, idem.ErrSeal) {
		t.Fatalf("event %s %v", ev.Outcome, ev.Err)
	}

	failing, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: mem, BodySealer: failingSealer{sealer}})
	if err != nil {
		t.Fatal(err)
	}
	if resp := runFirst(t, failing, "k2"); resp.Status != http.StatusInternalServerError {
		t.Fatalf("a failed seal answered %d %q", resp.Status, resp.Body)
	}
	if rec, free := storetest.Free(t, mem, "alice", "k2"); !free {
		t.Fatalf("a failed seal left the key claimed: %+v", rec)
	}
}
