package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/core/storetest"
)

// syncBuffer is a log destination the consumer's goroutine writes while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// advisory is what the dead-event stream keeps: JetStream's terminated
// and max_deliver advisories.
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

const (
	advisoryTerminated = "io.nats.jetstream.advisory.v1.terminated"
	advisoryMaxDeliver = "io.nats.jetstream.advisory.v1.max_deliver"
)

// TestDeadEvents runs the consumer against NATS JetStream and PostgreSQL:
// events that can never be recorded (a malformed payload, an invalid
// one, a row the ledger's constraints refuse, a value PostgreSQL cannot
// store) are terminated at their first delivery; an event whose row waits
// on a lock past lock_timeout is Nak'ed and recorded once the lock goes;
// one whose lock stays is delivered -max-deliver times and no more. Every
// dead event, and only those, has its advisory in the dead-event stream,
// naming its stream sequence.
func TestDeadEvents(t *testing.T) {
	const maxDeliver = 4
	ctx := context.Background()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS on %s (scripts/services.sh starts it): %v", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	suffix := randHex(4)
	cfg := config{
		natsURL: natsURL,
		// A row that waits on a lock gives up after 300ms: 55P03.
		dsn:    pgDSN + "&lock_timeout=300ms",
		stream: "LEDGER_DEAD_TEST_" + suffix, subject: "ledgerdeadtest." + suffix, consumer: "ledger",
		ledgerTable: "ledger_dead_" + suffix, idemTable: "ledger_dead_idem_" + suffix,
		fingerprintKey: string(storetest.FingerprintKey),
		requestTimeout: 2 * time.Second, lease: 4 * time.Second, ackWait: 5 * time.Second,
		nakDelay: 50 * time.Millisecond, maxDeliver: maxDeliver,
	}
	cfg.deadStream = cfg.stream + "_DEAD"
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), cfg.stream)
		_ = js.DeleteStream(context.Background(), cfg.deadStream)
		_, _ = pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s", cfg.ledgerTable, cfg.idemTable))
	})
	// The ledger table as the consumer makes it, with a rule of the
	// ledger's own: one row per payment.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL,
		payment_id text NOT NULL UNIQUE, amount bigint NOT NULL, currency text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`,
		cfg.ledgerTable)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: cfg.stream, Subjects: []string{cfg.subject}}); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- consume(cctx, cfg, slog.New(slog.NewTextHandler(&logs, nil))) }()
	defer func() {
		stop()
		if err := <-consumed; err != nil {
			t.Errorf("consume: %v", err)
		}
		if t.Failed() {
			t.Logf("consumer log:\n%s", logs.String())
		}
	}()

	publish := func(id, body string) uint64 {
		t.Helper()
		m := &nats.Msg{Subject: cfg.subject, Data: []byte(body), Header: nats.Header{}}
		m.Header.Set(EventIDHeader, id)
		m.Header.Set(AccountHeader, "acct_1")
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	rows := func(id string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE event_id = $1", cfg.ledgerTable), id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(d); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not within %v", what, d)
			}
		}
	}
	// hold inserts a ledger row for payment in a transaction it keeps
	// open: the consumer's row for the same payment waits on it.
	hold := func(payment string) pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_id, account, payment_id, amount, currency) VALUES ('held', 'test', $1, 1, 'EUR')`,
			cfg.ledgerTable), payment); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	event := func(payment string, amount int) string {
		return fmt.Sprintf(`{"payment_id":%q,"amount":%d,"currency":"EUR"}`, payment, amount)
	}

	okSeq := publish("evt_ok", event("pay_ok", 100))
	waitFor("evt_ok recorded", 20*time.Second, func() bool { return rows("evt_ok") == 1 })

	// Dead at once: terminated at the first delivery.
	terminated := map[uint64]string{
		publish("evt_malformed", `{"payment_id":`):                                    "malformed",
		publish("evt_invalid", event("pay_invalid", 0)):                               "invalid",
		publish("evt_same_payment", event("pay_ok", 100)):                             "unique violation",
		publish("evt_nul", `{"payment_id":"pay_\u0000","amount":1,"currency":"EUR"}`): "NUL in text",
	}

	// Transient, then recorded: the row waits on a lock for a few
	// deliveries, then the lock goes.
	passing := hold("pay_passing")
	passingSeq := publish("evt_passing", event("pay_passing", 200))
	waitFor("evt_passing Nak'ed twice", 20*time.Second, func() bool {
		return strings.Count(logs.String(), "msg=nak event_id=evt_passing") >= 2
	})
	if err := passing.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Transient for good: the lock stays until the deliveries are out.
	stuck := hold("pay_stuck")
	defer func() { _ = stuck.Rollback(ctx) }()
	stuckSeq := publish("evt_stuck", event("pay_stuck", 300))

	dead, err := js.Stream(ctx, cfg.deadStream)
	if err != nil {
		t.Fatalf("the consumer made no dead-event stream %s: %v", cfg.deadStream, err)
	}
	want := len(terminated) + 1
	waitFor(fmt.Sprintf("%d advisories in %s", want, cfg.deadStream), 30*time.Second, func() bool {
		info, err := dead.Info(ctx)
		return err == nil && info.State.Msgs >= uint64(want)
	})
	waitFor("evt_passing recorded", 20*time.Second, func() bool { return rows("evt_passing") == 1 })
	time.Sleep(time.Second) // an advisory too many would come now
	info, err := dead.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]advisory{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := dead.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var a advisory
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatalf("%s: %v", m.Data, err)
		}
		if _, dup := got[a.StreamSeq]; dup || a.Stream != cfg.stream || a.Consumer != cfg.consumer {
			t.Errorf("advisory %s: another one for this event, or not of %s/%s", m.Data, cfg.stream, cfg.consumer)
		}
		got[a.StreamSeq] = a
	}
	for seq, what := range terminated {
		if a := got[seq]; a.Type != advisoryTerminated || a.Deliveries != 1 {
			t.Errorf("%s event (stream seq %d): advisory %+v; want terminated at delivery 1", what, seq, a)
		}
	}
	if a := got[stuckSeq]; a.Type != advisoryMaxDeliver || a.Deliveries != maxDeliver {
		t.Errorf("stuck event (stream seq %d): advisory %+v; want max_deliver after %d deliveries", stuckSeq, a, maxDeliver)
	}
	for seq, what := range map[uint64]string{okSeq: "recorded", passingSeq: "passing"} {
		if a, ok := got[seq]; ok {
			t.Errorf("%s event (stream seq %d): advisory %+v; want none", what, seq, a)
		}
	}
	if len(got) != want {
		t.Errorf("%d advisories, want %d", len(got), want)
	}
	for _, line := range []string{
		fmt.Sprintf("msg=terminated event_id=evt_same_payment stream_seq=%d delivery=1", findSeq(terminated, "unique violation")),
		fmt.Sprintf(`msg="out of deliveries" event_id=evt_stuck stream_seq=%d delivery=%d`, stuckSeq, maxDeliver),
	} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("the consumer's log has no %q", line)
		}
	}
	if n := rows("evt_ok") + rows("evt_passing"); n != 2 {
		t.Errorf("%d rows of the recorded events, want 2", n)
	}
	for _, id := range []string{"evt_malformed", "evt_invalid", "evt_same_payment", "evt_nul", "evt_stuck"} {
		if n := rows(id); n != 0 {
			t.Errorf("%s: %d rows, want none", id, n)
		}
	}
	cons, err := js.Consumer(ctx, cfg.stream, cfg.consumer)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("nothing pending", 10*time.Second, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

func findSeq(m map[uint64]string, what string) uint64 {
	for seq, w := range m {
		if w == what {
			return seq
		}
	}
	return 0
}
