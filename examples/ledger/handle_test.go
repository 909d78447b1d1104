package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
)

// TestHandleDecisions: what the consumer does with each delivery case, on
// PostgreSQL, without NATS: the table in README.md.
func TestHandleDecisions(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	suffix := randHex(4)
	ledgerTable, idemTable := "ledger_unit_"+suffix, "ledger_unit_idem_"+suffix
	store, err := idempgx.New(pool, idempgx.WithTable(idemTable))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s", ledgerTable, idemTable))
	})
	engine, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, RequestTimeout: time.Second, StoreTimeout: time.Second, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := &Ledger{Engine: engine, Table: ledgerTable}
	msg := func(id, account, body string) (nats.Header, []byte) {
		h := nats.Header{}
		if id != "" {
			h.Set(EventIDHeader, id)
		}
		if account != "" {
			h.Set(AccountHeader, account)
		}
		return h, []byte(body)
	}
	valid := `{"payment_id":"pay_1","amount":100,"currency":"EUR"}`
	step := func(what string, h nats.Header, body []byte, delivered uint64, want Action, wantWhy string) time.Duration {
		t.Helper()
		action, delay, why := l.Handle(ctx, h, body, delivered, 100*time.Millisecond)
		if action != want || (wantWhy != "" && why != wantWhy) {
			t.Fatalf("%s: %v %v %q, want %v %q", what, action, delay, why, want, wantWhy)
		}
		return delay
	}
	rows := func(id string) int {
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE event_id = $1", ledgerTable), id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The ledger table is missing: the insert fails, the key is released
	// and the message Nak'ed with a backoff that doubles per delivery.
	h, b := msg("evt_1", "acct_1", valid)
	if d := step("transient", h, b, 3, Nak, ""); d != 400*time.Millisecond {
		t.Fatalf("backoff on the third delivery %v, want 400ms", d)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL,
		payment_id text NOT NULL, amount bigint NOT NULL, currency text NOT NULL)`, ledgerTable)); err != nil {
		t.Fatal(err)
	}
	step("redelivery after the outage", h, b, 4, Ack, "recorded")
	step("redelivery after the commit", h, b, 5, Ack, "replayed")
	step("published twice", h, b, 1, Ack, "replayed")
	if n := rows("evt_1"); n != 1 {
		t.Fatalf("rows %d, want 1", n)
	}
	h2, b2 := msg("evt_1", "acct_1", `{"payment_id":"pay_2","amount":5,"currency":"EUR"}`)
	step("the id reused for another event", h2, b2, 1, Term, string(idem.ProblemKeyReused))
	h3, b3 := msg("evt_bad", "acct_1", `{"payment_id":"pay_3","amount":0,"currency":"EUR"}`)
	step("invalid", h3, b3, 1, Term, "invalid event (stored as failed)")
	step("invalid, redelivered", h3, b3, 2, Term, "invalid event (stored as failed)")
	h4, b4 := msg("evt_4", "", valid)
	step("no account", h4, b4, 1, Term, string(idem.ProblemUnauthenticated))
	h5, b5 := msg("", "acct_1", valid)
	step("no event id", h5, b5, 1, Term, string(idem.ProblemKeyMissing))

	// Another consumer holds the key: Nak'ed for at least its RetryAfter.
	h6, b6 := msg("evt_6", "acct_1", valid)
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = engine.Do(ctx, idem.Call{Principal: "acct_1", Key: "evt_6", Operation: "ledger.record", Encoding: "application/json", Input: b6},
			func(ctx context.Context) (idem.Response, error) {
				close(held)
				time.Sleep(300 * time.Millisecond)
				return idem.Response{}, fmt.Errorf("let go")
			})
	}()
	<-held
	if d := step("held", h6, b6, 1, Nak, string(idem.ProblemKeyInUse)); d < time.Second {
		t.Fatalf("Nak delay %v while held, want the RetryAfter (≥ 1s)", d)
	}
	<-done
	step("after the holder let go", h6, b6, 2, Ack, "recorded")
	if n := rows("evt_bad") + rows("evt_4") + rows("evt_6"); n != 1 {
		t.Fatalf("rows %d, want 1 (evt_6 only)", n)
	}

	// Rows the database refuses for good: terminated at the first
	// delivery, released (a fixed database may take a republished event).
	// The ledger takes at most 1,000,000 per entry from here on.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CHECK (amount <= 1000000)`, ledgerTable)); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, h nats.Header, b []byte, sqlstate string) {
		t.Helper()
		for delivered := uint64(1); delivered <= 2; delivered++ {
			action, _, why := l.Handle(ctx, h, b, delivered, 100*time.Millisecond)
			if action != Term || !strings.HasPrefix(why, "refused by the database: ") || !strings.Contains(why, "SQLSTATE "+sqlstate) {
				t.Fatalf("%s, delivery %d: %v %q; want Term, SQLSTATE %s", what, delivered, action, why, sqlstate)
			}
		}
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE key = $1 AND state <> 'released'", idemTable), h.Get(EventIDHeader)).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s: %d records (%v), want the key released", what, n, err)
		}
	}
	h7, b7 := msg("evt_7", "acct_1", `{"payment_id":"pay_7","amount":2000000,"currency":"EUR"}`)
	refused("an amount over the ledger's limit (check violation)", h7, b7, "23514")
	h8, b8 := msg("evt_8", "acct_1", `{"payment_id":"pay_\u0000","amount":100,"currency":"EUR"}`)
	refused("a NUL in a text column (data exception)", h8, b8, "22021")
	if n := rows("evt_7") + rows("evt_8"); n != 0 {
		t.Fatalf("rows %d of refused events, want 0", n)
	}
}

// TestRefusedForGood: which handler errors terminate an event and which
// are retried.
func TestRefusedForGood(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("writing the ledger row: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{pg("22021"), true}, // a NUL in text
		{pg("22003"), true}, // numeric out of range
		{pg("22001"), true}, // string too long
		{pg("23505"), true}, // unique violation
		{pg("23514"), true}, // check violation
		{pg("23502"), true}, // not null violation
		{pg("23503"), true}, // foreign key violation
		{pg("54000"), true}, // index row too large
		{pg("40001"), false},
		{pg("40P01"), false},
		{pg("55P03"), false},
		{pg("57014"), false},
		{pg("57P01"), false}, // admin shutdown
		{pg("08006"), false},
		{pg("53300"), false}, // too many connections
		{pg("42P01"), false}, // the table missing: an operator's fix
		{pg("42501"), false}, // a privilege missing: likewise
		{pg("XX000"), false},
		{pg(""), false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
	} {
		if got := refusedForGood(tc.err); got != tc.want {
			t.Errorf("refusedForGood(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
