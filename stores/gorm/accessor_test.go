package idemgorm_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"github.com/idemgo/idem/stores/gorm/idemgormtest"
)

func beginAttempt(t *testing.T, store idemstore.Store, key string) *idem.Attempt {
	t.Helper()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	att, resp := e.Begin(context.Background(), idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice",
		Key: key, ContentType: "application/json", Body: strings.NewReader(`{}`)})
	if att == nil {
		t.Fatalf("no claim: %+v", resp)
	}
	t.Cleanup(att.Abort)
	return att
}

// TestDBThroughTheFrameworksContext: DB finds the transaction when the
// handler passes the framework's own context, which the adapter gave the
// attempt (idemadapter.ContextKey), and never hands out the fallback database
// while an attempt of another store is running: its statements fail.
func TestDBThroughTheFrameworksContext(t *testing.T) {
	f := idemgormtest.NewFixture(t, "sqlite")
	att := beginAttempt(t, f.Store, "k-gin")
	fw := storetest.FrameworkContext(att)
	db := idemgorm.DB(fw, f.DB)
	if tx, ok := idemgorm.Tx(fw); !ok || db.Statement.ConnPool != tx.Statement.ConnPool {
		t.Fatal("DB through the framework's context is not the idempotency transaction")
	}
	if err := db.Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", "k-gin").Error; err != nil {
		t.Fatalf("a write through the transaction found by the framework's context: %v", err)
	}

	// No attempt at all: the fallback, as for a route without idempotency.
	if err := idemgorm.DB(context.Background(), f.DB).Exec("SELECT 1").Error; err != nil {
		t.Fatalf("the fallback without an attempt: %v", err)
	}
	// An attempt of another store: never the fallback.
	other := beginAttempt(t, memstore.MustNew(), "k-other")
	for name, ctx := range map[string]context.Context{
		"request context":   other.Context(),
		"framework context": storetest.FrameworkContext(other),
	} {
		err := idemgorm.DB(ctx, f.DB).Exec("INSERT INTO "+f.Effects+" (id) VALUES (?)", "k-other").Error
		if !errors.Is(err, idemgorm.ErrNoTx) {
			t.Fatalf("%s: DB during another store's attempt ran the write (%v), want ErrNoTx", name, err)
		}
	}
	var n int64
	if err := f.DB.Table(f.Effects).Where("id = ?", "k-other").Count(&n).Error; err != nil || n != 0 {
		t.Fatalf("%d rows written outside the guarantee, %v", n, err)
	}
}
