package storetest

import (
	"context"
	"net/http"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
)

// FrameworkContext returns a context as gin's *gin.Context is one by
// default: it answers Value for string keys only, and passes no other key
// through. When att is not nil, the context holds att's context under
// idemadapter.ContextKey, as an adapter stores the attempt's context in
// its framework's context; with nil it holds nothing. Tests of a store's
// accessor use it to show that a handler passing its framework's context
// finds the transaction, and that one without an attempt finds none.
func FrameworkContext(att *idem.Attempt) context.Context {
	keys := map[string]any{}
	if att != nil {
		keys[idemadapter.ContextKey] = att.Context()
	}
	return stringKeyed{Context: context.Background(), keys: keys}
}

type stringKeyed struct {
	context.Context
	keys map[string]any
}

func (c stringKeyed) Value(key any) any {
	if s, ok := key.(string); ok {
		return c.keys[s]
	}
	return nil
}

// testFrameworkContext: the store's accessor (through WriteEffect) finds
// the transaction when the handler passes its framework's own context,
// which the adapter gave the attempt under idemadapter.ContextKey, and the write
// through it commits with the stored response; a framework context without
// an attempt carries no transaction.
func testFrameworkContext(t *testing.T, b Backend) {
	eng, err := idem.New(idem.Config{FingerprintKey: FingerprintKey, Store: b.Store})
	if err != nil {
		t.Fatal(err)
	}
	key := uniq("fw")
	att, resp := eng.Begin(ctxT(t), idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice",
		Key: key, ContentType: "application/json", Body: strings.NewReader(`{}`)})
	if att == nil {
		t.Fatalf("no claim: %d %s", resp.Status, resp.Body)
	}
	defer att.Abort()
	if err := b.WriteEffect(FrameworkContext(nil), key+"/none"); err == nil {
		t.Fatal("WriteEffect found a transaction in a framework context without an attempt")
	}
	fw := FrameworkContext(att)
	if err := b.WriteEffect(fw, key); err != nil {
		t.Fatalf("WriteEffect through the framework's context: %v", err)
	}
	if got := att.Finish(idem.Result{Status: http.StatusCreated, Body: []byte("ok")}); got.Status != http.StatusCreated {
		t.Fatalf("finish: %d %s", got.Status, got.Body)
	}
	if n := effects(t, b, key); n != 1 {
		t.Fatalf("%d business writes committed, want 1", n)
	}
	if rec := get(t, b, "alice", key); rec.State != idemstore.StateCompleted {
		t.Fatalf("record %s after the settle, want completed", rec.State)
	}
}
