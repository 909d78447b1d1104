package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/storetest"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/idemgo/idem/stores/redis/idemredistest"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func claimReq(principal, key, body string, lease time.Duration) idemstore.ClaimRequest {
	return idemstore.ClaimRequest{
		Principal: principal, Key: key, Fingerprint: []byte("fp:" + body), Token: idemredistest.RandHex(16), Nonce: idemredistest.RandHex(16),
		RequestID: "req-" + idemredistest.RandHex(4), Lease: lease, Retention: time.Hour,
	}
}

func leaseOf(r idemstore.ClaimRequest) idemstore.Lease {
	return idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token}
}

func okOutcome(body string) idemstore.Outcome {
	return idemstore.Outcome{State: idemstore.StateCompleted, Response: idem.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body),
	}}
}

// newEnv is a store on the standalone server under a fresh prefix.
func newEnv(t testing.TB, opts ...idemredis.Option) *idemredistest.Env {
	t.Helper()
	return idemredistest.NewEnv(t, idemredistest.NewClient(t), opts...)
}

// server is a redis-server this test started itself, on a port of its own
// (never the shared :6379): for restarts, replicas and write counting.
type server struct {
	t    testing.TB
	port int
	args []string
	dir  string // its working directory: a replica's sync files land there
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// startServer starts redis-server on a free 127.0.0.1 port with no
// persistence, plus args, and stops it (by its pid) when t ends.
func startServer(t testing.TB, args ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("this test starts its own redis-server and none is on PATH: %v; install it (apt-get install redis-server, or `make services`)", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s := &server{t: t, port: port, args: args, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) start() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir}, s.args...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not answer: %v", s.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the server at once (SIGKILL): a crash, losing everything.
func (s *server) kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// client returns a client of the server, closed when the test ends.
func (s *server) client(t testing.TB, opts func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.addr()}
	if opts != nil {
		opts(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dirty returns the server's count of writes since start
// (rdb_changes_since_last_save): it moves with every write and nothing else.
func dirty(t testing.TB, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_changes_since_last_save:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no rdb_changes_since_last_save in INFO persistence")
	return 0
}

// counter is a go-redis hook that counts what reaches the network: a
// command processed alone is one round trip, a pipeline is one round trip.
type counter struct {
	mu        sync.Mutex
	trips     int
	commands  []string
	args      [][]any
	recording atomic.Bool
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.record(1, cmd)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.record(1, cmds...)
		return next(ctx, cmds)
	}
}

func (c *counter) record(trips int, cmds ...redis.Cmder) {
	if !c.recording.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips += trips
	for _, cmd := range cmds {
		c.commands = append(c.commands, cmd.Name())
		c.args = append(c.args, cmd.Args())
	}
}

// total is the round trips counted so far.
func (c *counter) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.trips)
}

// measure runs fn and returns the round trips and commands it cost.
func (c *counter) measure(fn func()) (int, []string) {
	c.mu.Lock()
	c.trips, c.commands, c.args = 0, nil, nil
	c.mu.Unlock()
	c.recording.Store(true)
	fn()
	c.recording.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trips, append([]string(nil), c.commands...)
}

func mustNil(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var errNoRow = errors.New("no row")

// paymentsDB stands for the application's SQL database: a payments table
// whose downstream_key column is unique, written with INSERT … ON CONFLICT
// DO NOTHING. It survives anything that happens to Redis.
type paymentsDB struct {
	mu        sync.Mutex
	byKey     map[string]payment // downstream_key → row
	conflicts atomic.Int64       // inserts the unique column absorbed
	nextID    atomic.Int64
}

type payment struct {
	ID            string
	DownstreamKey string
	Key           string
}

func newPaymentsDB() *paymentsDB { return &paymentsDB{byKey: map[string]payment{}} }

// insert is INSERT … ON CONFLICT (downstream_key) DO NOTHING RETURNING, then
// SELECT when nothing was inserted: the row for dk, and whether this call
// inserted it.
func (d *paymentsDB) insert(dk, key string) (payment, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p, ok := d.byKey[dk]; ok {
		d.conflicts.Add(1)
		return p, false
	}
	p := payment{ID: fmt.Sprintf("pay_%d", d.nextID.Add(1)), DownstreamKey: dk, Key: key}
	d.byKey[dk] = p
	return p, true
}

func (d *paymentsDB) lookup(dk string) (payment, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.byKey[dk]
	if !ok {
		return payment{}, errNoRow
	}
	return p, nil
}

// rowsFor counts the rows for an idempotency key.
func (d *paymentsDB) rowsFor(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, p := range d.byKey {
		if p.Key == key {
			n++
		}
	}
	return n
}

// paymentHandler is the handler the package documentation recommends, for
// tests that send every key with one body: the business write is keyed by
// idem.DownstreamKey in a unique column, and when the row exists already
// the handler answers from it. The recipe's comparison of that row with the
// request, for a key reused with another body, is played in
// recipe_test.go.
func paymentHandler(db *paymentsDB, key string) func(ctx context.Context) (int, []byte) {
	return func(ctx context.Context) (int, []byte) {
		if _, ok := idemredis.Tx(ctx); !ok {
			return http.StatusInternalServerError, []byte(`{"error":"no idemredis handle"}`)
		}
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return http.StatusInternalServerError, []byte(err.Error())
		}
		p, _ := db.insert(dk, key)
		return http.StatusCreated, fmt.Appendf(nil, `{"id":%q}`, p.ID)
	}
}

// reconcileFrom answers a takeover from the payments table: the row the
// crashed holder wrote, found by the same downstream key, or nil to run the
// handler again. It cannot compare the row with the request (it gets the
// record, not the request), which is safe only because these tests send
// every key with one body; the README says why a service's Reconcile lets
// the handler decide instead.
func reconcileFrom(db *paymentsDB) func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
	return func(ctx context.Context, stale idem.Record) (*idem.Response, error) {
		dk, err := idem.DownstreamKey(ctx, "payment")
		if err != nil {
			return nil, err
		}
		p, err := db.lookup(dk)
		if errors.Is(err, errNoRow) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
			Body: fmt.Appendf(nil, `{"id":%q}`, p.ID)}, nil
	}
}

// run sends one request for key through eng.
func run(eng *idem.Engine, principal, key string, handler func(ctx context.Context) (int, []byte)) *idem.Response {
	return storetest.Serve(eng, principal, key, handler)
}
