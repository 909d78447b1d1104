package storetest

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// testMisconfigured: a store whose table does not exist answers every call
// with an error wrapping idem.ErrMisconfigured, never ErrTransient (a retry
// cannot help); idem.New refuses it at start-up, and an engine that skipped
// the check answers 500 store-misconfigured, not "retry later".
func testMisconfigured(t *testing.T, b Backend) {
	if b.Misconfigured == nil {
		t.Skip("not applicable: the backend has no way to point a store at a missing table (Backend.Misconfigured)")
	}
	s := b.Misconfigured(t)
	ctx := ctxT(t)
	_, claimErr := s.Claim(ctx, claimReq("alice", uniq("k"), "body"))
	_, getErr := s.Get(ctx, "alice", uniq("k"))
	for what, err := range map[string]error{"Claim": claimErr, "Get": getErr} {
		if !errors.Is(err, idem.ErrMisconfigured) || errors.Is(err, idemstore.ErrTransient) {
			t.Fatalf("%s on a missing table = %v, want ErrMisconfigured and not ErrTransient", what, err)
		}
	}
	if _, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: s}); !errors.Is(err, idem.ErrMisconfigured) {
		t.Fatalf("idem.New on a store without its table = %v, want ErrMisconfigured", err)
	}
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: s, SkipStoreCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	resp := Serve(eng, "alice", uniq("k"), func(context.Context) (int, []byte) {
		t.Error("the handler ran on a store without its table")
		return http.StatusCreated, nil
	})
	if resp.Status != http.StatusInternalServerError || !bytes.Contains(resp.Body, []byte(idem.ProblemMisconfigured)) {
		t.Fatalf("the engine on a missing table answered %d %s, want 500 %s", resp.Status, resp.Body, idem.ProblemMisconfigured)
	}
}

// testUnreachable: a store whose server does not answer fails every call
// with an error wrapping idemstore.ErrTransient, and a caller that gave up
// (a cancelled context) is not told to retry.
func testUnreachable(t *testing.T, b Backend) {
	if b.Unreachable == nil {
		t.Skip("not applicable: the store has no server to be cut off from (Backend.Unreachable)")
	}
	s := b.Unreachable(t)
	ctx := ctxT(t)
	_, claimErr := s.Claim(ctx, claimReq("alice", uniq("k"), "body"))
	_, getErr := s.Get(ctx, "alice", uniq("k"))
	for what, err := range map[string]error{"Claim": claimErr, "Get": getErr} {
		if !errors.Is(err, idemstore.ErrTransient) {
			t.Fatalf("%s on an unreachable server = %v, want ErrTransient", what, err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Store.Get(cancelled, "alice", uniq("k")); err == nil || errors.Is(err, idemstore.ErrTransient) {
		t.Fatalf("Get with a cancelled context = %v, want an error that is not ErrTransient", err)
	}
}

// testClaimBounds: a store whose schema bounds the fingerprint at 255 bytes
// and the nonce at 64 (the SQL stores) refuses a claim over either bound
// before it writes anything.
func testClaimBounds(t *testing.T, b Backend) {
	if b.Dialect == "" {
		t.Skip("not applicable: the store keeps fields of any length (Backend.Dialect is empty)")
	}
	for name, edit := range map[string]func(*idemstore.ClaimRequest){
		"fingerprint over 255 bytes": func(r *idemstore.ClaimRequest) { r.Fingerprint = make([]byte, 256) },
		"nonce over 64 bytes":        func(r *idemstore.ClaimRequest) { r.Nonce = strings.Repeat("n", 65) },
	} {
		req := claimReq("alice", uniq("bounds"), "body")
		edit(&req)
		_, err := b.Store.Claim(ctxT(t), req)
		if _, gerr := b.Store.Get(ctxT(t), req.Principal, req.Key); err == nil || !errors.Is(gerr, idemstore.ErrNotFound) {
			t.Fatalf("%s: Claim answered %v, then Get %v; want a refusal that writes nothing", name, err, gerr)
		}
	}
}
