package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/core/storetest"
)

// The crash test: a producer publishes payment events, a fifth of them or
// more twice, while the consumer process is SIGKILLed at random moments and
// restarted. At the end every valid event has exactly one ledger row and a
// completed record, every invalid one a failed record and no row, and the
// consumer has nothing pending. By default it is short enough for make
// test; IDEM_SOAK=<duration> (make soak) runs it that long with more events.

const (
	natsURL = "nats://127.0.0.1:4222"
	pgDSN   = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// consumerProc is one running consumer process.
type consumerProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startConsumer(t *testing.T, bin string, args []string, logs *strings.Builder, mu *sync.Mutex) *consumerProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &consumerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			if logs.Len() < 1<<20 {
				logs.WriteString(sc.Text() + "\n")
			}
			mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	return p
}

func TestLedgerCrashSoak(t *testing.T) {
	events, kills, budget := 2000, 20, 60*time.Second
	if d, err := time.ParseDuration(os.Getenv("IDEM_SOAK")); err == nil && d > 0 {
		// 50 events a second of the budget, between 2,000 and 20,000:
		// the producer publishes one at a time and must be done well
		// within a short budget too.
		events, kills, budget = int(min(20000, max(2000, 50*d.Seconds()))), 1<<30, d
	}
	const dupShare, invalidShare = 0.25, 0.01

	dir := t.TempDir()
	bin := filepath.Join(dir, "ledger")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	suffix := randHex(4)
	stream, subject := "LEDGER_TEST_"+suffix, "ledgertest."+suffix
	ledgerTable, idemTable := "ledger_test_"+suffix, "ledger_idem_"+suffix
	args := []string{"-nats", natsURL, "-dsn", pgDSN, "-stream", stream, "-subject", subject,
		"-ledger-table", ledgerTable, "-idem-table", idemTable, "-fingerprint-key", string(storetest.FingerprintKey),
		"-request-timeout", "1s", "-lease", "2500ms", "-ack-wait", "3s", "-nak-delay", "100ms",
		// Most of a handler's time is between its ledger write and its
		// commit, so most SIGKILLs land there.
		"-handler-delay", "4ms",
		// Every SIGKILL uses up a delivery of each message the consumer
		// had fetched and not yet acked (up to a batch of 32), so with
		// the default -max-deliver a message cut short by ten of the kills
		// would be dead, reported on MAX_DELIVERIES, and never recorded:
		// what -max-deliver is for (dead_test.go proves it), but not what
		// this test is about. More deliveries than kills keeps every
		// event recordable.
		"-max-deliver", strconv.Itoa(min(kills, 1000) + defaultMaxDeliver)}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS on %s (scripts/services.sh starts it): %v", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = js.DeleteStream(context.Background(), stream)
		_, _ = pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s", ledgerTable, idemTable))
	})

	var (
		logMu sync.Mutex
		logs  strings.Builder
	)
	defer func() {
		if t.Failed() {
			logMu.Lock()
			t.Logf("consumer logs (last 4 KiB):\n%s", tail(logs.String(), 4096))
			logMu.Unlock()
		}
	}()
	start := time.Now()
	proc := startConsumer(t, bin, args, &logs, &logMu)

	// The producer: every event once, a share of them again (at once or
	// later), a few invalid ones.
	valid, invalid, dups := 0, 0, 0
	producerDone := make(chan error, 1)
	var later []*nats.Msg
	msgs := make([]*nats.Msg, 0, events)
	for i := range events {
		id := fmt.Sprintf("evt-%s-%d", suffix, i)
		amount := int64(100 + i)
		if mrand.Float64() < invalidShare {
			amount, invalid = 0, invalid+1
		} else {
			valid++
		}
		data, _ := json.Marshal(Event{PaymentID: "pay_" + id, Amount: amount, Currency: "EUR"})
		m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		m.Header.Set(EventIDHeader, id)
		m.Header.Set(AccountHeader, fmt.Sprintf("acct_%d", i%7))
		msgs = append(msgs, m)
		if mrand.Float64() < dupShare {
			dups++
			if mrand.IntN(2) == 0 {
				msgs = append(msgs, m)
			} else {
				later = append(later, m)
			}
		}
	}
	go func() {
		pctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		pace := budget / 4 / time.Duration(len(msgs)+len(later))
		for _, m := range append(msgs, later...) {
			if _, err := js.PublishMsg(pctx, m); err != nil {
				producerDone <- err
				return
			}
			time.Sleep(pace)
		}
		producerDone <- nil
	}()

	// The killer: SIGKILL at random moments, restart at once.
	killed := 0
	deadline := start.Add(budget / 2)
	produced := false
	for killed < kills && time.Now().Before(deadline) || !produced {
		select {
		case err := <-producerDone:
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			produced = true
			continue
		case <-time.After(time.Duration(50+mrand.IntN(600)) * time.Millisecond):
		}
		if killed >= kills || time.Now().After(deadline) {
			continue
		}
		_ = proc.cmd.Process.Signal(syscall.SIGKILL)
		<-proc.done
		killed++
		proc = startConsumer(t, bin, args, &logs, &logMu)
	}
	t.Cleanup(func() {
		_ = proc.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-proc.done:
		case <-time.After(10 * time.Second):
			_ = proc.cmd.Process.Kill()
		}
	})

	// Drain: nothing pending on the consumer, every event settled.
	cons, err := js.Consumer(ctx, stream, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	drainBy := time.Now().Add(budget)
	for {
		info, err = cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var settled int
		_ = pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE state <> 'in_progress'`, idemTable)).Scan(&settled)
		if info.NumPending == 0 && info.NumAckPending == 0 && settled == valid+invalid {
			break
		}
		if time.Now().After(drainBy) {
			t.Fatalf("not drained: pending %d, ack pending %d, settled %d of %d; %s",
				info.NumPending, info.NumAckPending, settled, valid+invalid, unsettled(ctx, pool, js, stream, idemTable, msgs, &logs, &logMu))
		}
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(start)

	// Exactly once: one row per valid event, none for invalid ones.
	var rows, distinct, multi int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(DISTINCT event_id) FROM %s`, ledgerTable)).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT event_id FROM %s GROUP BY event_id HAVING count(*) > 1) d`, ledgerTable)).Scan(&multi); err != nil {
		t.Fatal(err)
	}
	var completed, failed, inProgress int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'failed'),
		count(*) FILTER (WHERE state = 'in_progress') FROM %s`, idemTable)).Scan(&completed, &failed, &inProgress); err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	replays, naks := strings.Count(logs.String(), `msg=replayed`), strings.Count(logs.String(), `msg=nak`)
	logMu.Unlock()
	t.Logf("events %d (valid %d, invalid %d), published twice %d (%.0f %%), SIGKILLs %d, replayed and acked %d, naks %d, "+
		"ledger rows %d, completed %d, failed %d, in progress %d, elapsed %v",
		events, valid, invalid, dups, 100*float64(dups)/float64(events), killed, replays, naks,
		rows, completed, failed, inProgress, elapsed.Round(time.Millisecond))
	if rows != valid || distinct != valid || multi != 0 {
		t.Fatalf("ledger rows %d (distinct %d, %d events with more than one); want %d, one each", rows, distinct, multi, valid)
	}
	if completed != valid || failed != invalid || inProgress != 0 {
		t.Fatalf("records: completed %d, failed %d, in progress %d; want %d, %d, 0", completed, failed, inProgress, valid, invalid)
	}
	if killed < min(kills, 20) {
		t.Fatalf("only %d SIGKILLs", killed)
	}
	if float64(dups) < 0.2*float64(events) {
		t.Fatalf("only %d duplicates", dups)
	}
}

// unsettled describes the events without a settled record: each one's
// record state (none if it was never claimed), the dead-event advisories
// kept for the stream, and the consumer's log lines that name the event.
func unsettled(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, stream, idemTable string, msgs []*nats.Msg, logs *strings.Builder, mu *sync.Mutex) string {
	var b strings.Builder
	if ds, err := js.Stream(ctx, stream+"_DEAD"); err == nil {
		if si, err := ds.Info(ctx); err == nil {
			fmt.Fprintf(&b, "dead-event advisories %d", si.State.Msgs)
		}
	}
	seen, described := map[string]bool{}, 0
	for _, m := range msgs {
		id := m.Header.Get(EventIDHeader)
		if seen[id] || described == 10 {
			continue
		}
		seen[id] = true
		var state string
		err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT state::text FROM %s WHERE key = $1`, idemTable), id).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			state = "none"
		case err != nil:
			state = "unread: " + err.Error()
		case state != "in_progress":
			continue
		}
		described++
		fmt.Fprintf(&b, "; %s: record %s", id, state)
		mu.Lock()
		for _, line := range strings.Split(logs.String(), "\n") {
			if slices.Contains(strings.Fields(line), "event_id="+id) {
				fmt.Fprintf(&b, "\n    %s", line)
			}
		}
		mu.Unlock()
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
