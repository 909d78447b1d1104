package ctl_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
)

// A crashed attempt's claim, found with Stale and released with Release.
// The store's clock, which the commands measure every age on, is pinned so
// that the output is the same on every run.
func Example() {
	clock := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	store := memstore.MustNew(memstore.WithClock(now))
	engine, _ := idem.New(idem.Config{FingerprintKey: []byte("example only: read yours from a secret store"), Store: store})

	// An attempt claims the key, then its process dies: nothing settles
	// or releases it.
	body := `{"amount":1250}`
	engine.Begin(context.Background(), idem.Request{Method: http.MethodPost, Path: "/payments", Principal: "alice",
		Key: "order-1", ContentType: "application/json", RequestID: "req-1", Body: strings.NewReader(body),
		ContentLength: int64(len(body))})
	clock = clock.Add(5 * time.Minute)

	o := ctl.Options{Store: store, Name: "memory", Yes: true}
	ctx := context.Background()
	if err := ctl.Stale(ctx, os.Stdout, o); err != nil {
		fmt.Println(err)
	}
	// The lease token it read fences the release (the token is random,
	// so the line is cut before it here).
	var out strings.Builder
	if err := ctl.Release(ctx, &out, o, "alice", "order-1"); err != nil {
		fmt.Println(err)
	}
	line, _, _ := strings.Cut(out.String(), ", lease token")
	fmt.Println(line)
	// The key is free again; a second release is refused.
	err := ctl.Release(ctx, io.Discard, o, "alice", "order-1")
	fmt.Println(err, "- exit", ctl.ExitCode(err))
	// Output:
	// PRINCIPAL  KEY      REQUEST ID  LOCKED AT (UTC)           LEASE ENDED  OUTCOME
	// alice      order-1  req-1       2026-11-30T09:00:00.000Z  4m20s ago    -
	// 1 stale claims
	// released alice/order-1 (in progress, locked 5m0s ago, lease ended 4m20s ago, request id req-1
	// refused: alice/order-1 is released already: its key is free - exit 4
}
