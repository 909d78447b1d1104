// Command ledger is idem's exactly-once queue consumer: it reads payment
// events from a NATS JetStream stream with one durable pull consumer and
// manual acks, and writes one ledger row per event, however often the
// event is delivered.
//
// Each message's Event-Id header is the idempotency key and its Account
// header the principal. The ledger row and the idempotency record commit in
// one PostgreSQL transaction through idem's call API (Engine.Do on
// idempgx); the ack goes out only after that commit. A redelivery (a crash
// before the ack, a lost ack, a Nak, the producer publishing twice) finds
// the record completed and is acked without writing again.
//
// A message is delivered at most -max-deliver times. One that can never be
// recorded (an invalid payload, an id reused for another event, a ledger
// row the database refuses: SQLSTATE class 22, 23 or 54) is terminated at
// once; one that failed for a reason that can pass (the database
// unreachable, a serialization failure, a deadlock, a lock or statement
// timeout) is Nak'ed with a backoff and tried again until the deliveries
// run out. Either way JetStream publishes an advisory,
// $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer> or
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>, and the
// consumer keeps them in the stream -dead-stream (default <stream>_DEAD):
// each names the dead event's stream_seq, and the event itself stays in
// the stream. See README.md, "Dead events".
//
//	go run ./examples/ledger -dsn postgres://postgres@127.0.0.1:5432/test
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The headers the producer sets on every event.
const (
	// EventIDHeader carries the event's id: the idempotency key. A producer
	// that publishes an event again (a retry after a lost publish ack) sends
	// the same id.
	EventIDHeader = "Event-Id"
	// AccountHeader carries the producer's account: the principal.
	AccountHeader = "Account"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

type config struct {
	natsURL, dsn, stream, subject, consumer, ledgerTable, idemTable string
	deadStream                                                      string
	fingerprintKey                                                  string
	requestTimeout, lease                                           time.Duration
	ackWait, nakDelay                                               time.Duration
	handlerDelay                                                    time.Duration
	maxDeliver                                                      int
}

// defaultMaxDeliver is -max-deliver's default. With -nak-delay's default
// backoff (200ms doubled per delivery, up to 10s) the last of 10
// deliveries comes about 40s after the first: long enough to ride out a
// database failover, short enough that a poison event the consumer took
// for transient stops within a minute.
const defaultMaxDeliver = 10

func parseConfig(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL")
	fs.StringVar(&c.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	fs.StringVar(&c.stream, "stream", "PAYMENTS", "JetStream stream (created if absent)")
	fs.StringVar(&c.subject, "subject", "payments.events", "subject the stream keeps")
	fs.StringVar(&c.consumer, "consumer", "ledger", "durable pull consumer name")
	fs.StringVar(&c.ledgerTable, "ledger-table", "ledger_entries", "ledger table (created if absent)")
	fs.StringVar(&c.idemTable, "idem-table", "ledger_idempotency", "idempotency records table (created if absent)")
	fs.StringVar(&c.deadStream, "dead-stream", "", "JetStream stream that keeps the advisories of dead events, terminated or out of deliveries "+
		"(created if absent; default the -stream name and _DEAD)")
	fs.IntVar(&c.maxDeliver, "max-deliver", defaultMaxDeliver, "deliveries of one message at most, the first included; then it is dead")
	fs.DurationVar(&c.requestTimeout, "request-timeout", 2*time.Second, "deadline of one event's handler")
	fs.DurationVar(&c.lease, "lease", 0, "claim lease (default: request timeout + store timeout + 1s)")
	fs.DurationVar(&c.ackWait, "ack-wait", 10*time.Second, "redelivery of an unacked message after")
	fs.DurationVar(&c.handlerDelay, "handler-delay", 0, "sleep after the ledger row is written, before the commit (crash drills)")
	fs.DurationVar(&c.nakDelay, "nak-delay", 200*time.Millisecond, "first backoff of a transient failure, doubled per delivery up to 10s")
	fs.StringVar(&c.fingerprintKey, "fingerprint-key", os.Getenv("IDEM_FINGERPRINT_KEY"),
		"secret the event fingerprints are keyed with, at least 32 bytes, the same for every consumer; required (default $IDEM_FINGERPRINT_KEY)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if len(c.fingerprintKey) < idem.MinFingerprintKeyBytes {
		err := fmt.Errorf("ledger: -fingerprint-key (or IDEM_FINGERPRINT_KEY) must be at least %d bytes, the same for every consumer", idem.MinFingerprintKeyBytes)
		fmt.Fprintln(fs.Output(), err)
		return c, err
	}
	if c.maxDeliver < 1 {
		err := fmt.Errorf("ledger: -max-deliver must be at least 1, got %d", c.maxDeliver)
		fmt.Fprintln(fs.Output(), err)
		return c, err
	}
	if c.deadStream == "" {
		c.deadStream = c.stream + "_DEAD"
	}
	if c.lease == 0 {
		c.lease = c.requestTimeout + time.Second + time.Second
	}
	return c, nil
}

func run(args []string, stderr *os.File) int {
	cfg, err := parseConfig(args)
	if err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := consume(ctx, cfg, log); err != nil {
		log.Error("ledger stopped", slog.String("error", err.Error()))
		return 1
	}
	log.Info("ledger stopped")
	return 0
}

// Ledger writes payment events to the ledger table, once each.
type Ledger struct {
	Engine *idem.Engine
	Table  string
	// Delay is slept after the ledger row is written, before the commit
	// (-handler-delay), so a crash drill lands between the two.
	Delay time.Duration
}

// Event is a payment event as the producer publishes it.
type Event struct {
	PaymentID string `json:"payment_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// Status of a handled event, as the call API stores it (HTTP statuses,
// so Config.Classify's default applies): recorded, or refused for good.
const (
	statusRecorded = 201
	statusInvalid  = 422
)

// Action is what the consumer does with a message after Handle.
type Action int

// The actions, one per delivery case (README.md).
const (
	Ack  Action = iota // recorded now or before: done
	Term               // can never be recorded: stop redelivering
	Nak                // not recorded, retry later
)

// Handle records one message through the call API and says what to do
// with it. delay is the Nak delay.
func (l *Ledger) Handle(ctx context.Context, header nats.Header, data []byte, delivered uint64, nakDelay time.Duration) (Action, time.Duration, string) {
	res, err := l.Engine.Do(ctx, idem.Call{
		Principal: header.Get(AccountHeader), Key: header.Get(EventIDHeader), Operation: "ledger.record",
		Encoding: "application/json", Input: data,
	}, func(ctx context.Context) (idem.Response, error) {
		var ev Event
		if err := json.Unmarshal(data, &ev); err != nil || ev.PaymentID == "" || ev.Amount <= 0 || !currencyRE.MatchString(ev.Currency) {
			// Deterministic: stored as failed, never retried.
			return idem.Response{Status: statusInvalid, Body: []byte("invalid payment event")}, nil
		}
		tx, ok := idempgx.Tx(ctx)
		if !ok {
			return idem.Response{}, errors.New("no idempotency transaction")
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_id, account, payment_id, amount, currency) VALUES ($1, $2, $3, $4, $5)`, l.Table),
			header.Get(EventIDHeader), header.Get(AccountHeader), ev.PaymentID, ev.Amount, ev.Currency)
		if err != nil {
			// Rolled back and released; Nak or Term as refusedForGood says.
			return idem.Response{}, fmt.Errorf("writing the ledger row: %w", err)
		}
		if l.Delay > 0 {
			time.Sleep(l.Delay)
		}
		return idem.Response{Status: statusRecorded}, nil
	})
	var ce *idem.CallError
	switch {
	case errors.As(err, &ce):
		switch ce.Problem {
		case idem.ProblemUnauthenticated, idem.ProblemPrincipalInvalid, idem.ProblemKeyMissing,
			idem.ProblemKeyInvalid, idem.ProblemKeyReused, idem.ProblemBodyTooLarge, idem.ProblemForbidden:
			// Not authenticated, no or a bad key, the id reused for
			// another event: the producer's doing, and no redelivery can
			// change it.
			return Term, 0, string(ce.Problem)
		}
		// The key held, the store down, the commit failed, and also a
		// misconfigured store or a result too large to store: those need
		// an operator, and the event must wait for them, not be dropped.
		d := max(ce.RetryAfter, backoff(nakDelay, delivered))
		return Nak, d, string(ce.Problem)
	case err != nil && refusedForGood(err):
		return Term, 0, "refused by the database: " + err.Error()
	case err != nil:
		return Nak, backoff(nakDelay, delivered), "released: " + err.Error()
	case res.State == idemstore.StateFailed:
		return Term, 0, "invalid event (stored as failed)"
	case res.State == idemstore.StateCompleted:
		if res.Replayed {
			return Ack, 0, "replayed"
		}
		return Ack, 0, "recorded"
	}
	return Nak, backoff(nakDelay, delivered), "released"
}

// refusedForGood reports whether err, the handler's, is PostgreSQL refusing
// the ledger row itself, so that every redelivery of the event would be
// refused again: SQLSTATE class 22 (data exception: a value the column
// cannot hold, a NUL in a text), 23 (integrity constraint violation: a
// unique, check, not-null or foreign key constraint) and 54 (program limit
// exceeded: a value too large for an index). Anything else can pass and is
// retried: no PostgreSQL error at all (the connection refused or cut, a
// timeout), class 40 (40001 serialization failure, 40P01 deadlock), 55P03
// (lock timeout), 57014 (statement timeout or cancel), class 08 and 53
// (connection, resources), and class 42 (a missing table or privilege),
// which an operator fixes while the event waits.
func refusedForGood(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// backoff doubles base per delivery, up to 10s.
func backoff(base time.Duration, delivered uint64) time.Duration {
	d := base
	for i := uint64(1); i < delivered && d < 10*time.Second; i++ {
		d *= 2
	}
	return min(d, 10*time.Second)
}

// consume runs the consumer until ctx ends.
func consume(ctx context.Context, cfg config, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, cfg.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := idempgx.New(pool, idempgx.WithTable(cfg.idemTable))
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
		id         bigserial PRIMARY KEY,
		event_id   text        NOT NULL,
		account    text        NOT NULL,
		payment_id text        NOT NULL,
		amount     bigint      NOT NULL,
		currency   text        NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`, cfg.ledgerTable)); err != nil {
		return err
	}
	engine, err := idem.New(idem.Config{Store: store, FingerprintKey: []byte(cfg.fingerprintKey), RequestTimeout: cfg.requestTimeout, StoreTimeout: time.Second, Lease: cfg.lease})
	if err != nil {
		return err
	}
	l := &Ledger{Engine: engine, Table: cfg.ledgerTable, Delay: cfg.handlerDelay}
	// The sweeper, on the consumer's engine, deletes the expired records
	// (nothing else does) and reports the stale claims no redelivery
	// takes over.
	swept := make(chan struct{})
	defer func() { <-swept }()
	go func() {
		defer close(swept)
		_ = (&idem.Sweeper{Engine: engine, Logger: log}).Run(ctx)
	}()

	nc, err := nats.Connect(cfg.natsURL, nats.Name("idem-ledger"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: cfg.stream, Subjects: []string{cfg.subject}})
	if err != nil {
		return fmt.Errorf("stream %s: %w", cfg.stream, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, deadStreamConfig(cfg.deadStream, cfg.stream)); err != nil {
		return fmt.Errorf("dead-event stream %s: %w", cfg.deadStream, err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: cfg.consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.ackWait, MaxDeliver: cfg.maxDeliver,
		MaxAckPending: 256,
	})
	if err != nil {
		return fmt.Errorf("consumer %s: %w", cfg.consumer, err)
	}
	log.Info("ledger consuming", slog.String("stream", cfg.stream), slog.String("consumer", cfg.consumer),
		slog.Int("max_deliver", cfg.maxDeliver), slog.String("dead_stream", cfg.deadStream))
	for ctx.Err() == nil {
		batch, err := cons.Fetch(32, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Warn("fetch", slog.String("error", err.Error()))
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			delivered, seq := uint64(1), uint64(0)
			if md != nil {
				delivered, seq = md.NumDelivered, md.Sequence.Stream
			}
			// A handled message is settled even when ctx ends: the commit
			// must not be followed by a lost ack for want of a context.
			hctx := context.WithoutCancel(ctx)
			action, delay, why := l.Handle(hctx, msg.Headers(), msg.Data(), delivered, cfg.nakDelay)
			var aerr error
			actx, cancel := context.WithTimeout(hctx, 5*time.Second)
			switch action {
			case Ack:
				aerr = msg.DoubleAck(actx)
			case Term:
				log.Warn("terminated", slog.String("event_id", msg.Headers().Get(EventIDHeader)), slog.Uint64("stream_seq", seq),
					slog.Uint64("delivery", delivered), slog.String("why", why))
				aerr = msg.Term()
			case Nak:
				if delivered >= uint64(cfg.maxDeliver) {
					// JetStream will not deliver it again: it reports it
					// on MAX_DELIVERIES instead.
					log.Warn("out of deliveries", slog.String("event_id", msg.Headers().Get(EventIDHeader)), slog.Uint64("stream_seq", seq),
						slog.Uint64("delivery", delivered), slog.String("why", why))
				} else {
					log.Info("nak", slog.String("event_id", msg.Headers().Get(EventIDHeader)), slog.String("why", why), slog.Duration("delay", delay))
				}
				aerr = msg.NakWithDelay(delay)
			}
			if why == "replayed" {
				log.Info("replayed", slog.String("event_id", msg.Headers().Get(EventIDHeader)), slog.Uint64("delivery", delivered))
			}
			cancel()
			if aerr != nil {
				// The message is redelivered after AckWait and replayed.
				log.Warn("ack", slog.String("error", aerr.Error()))
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			log.Warn("batch", slog.String("error", err.Error()))
		}
	}
	return nil
}

// deadStreamConfig is the stream that keeps the advisories JetStream
// publishes for every consumer of stream when a message is terminated or
// has used up its deliveries. Advisories are plain NATS messages, lost
// unless someone listens; in this stream they wait for an operator.
func deadStreamConfig(name, stream string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: "advisories of the dead events of " + stream + ": each names the event's stream_seq",
		Subjects: []string{
			"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + stream + ".*",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + ".*",
		},
	}
}
