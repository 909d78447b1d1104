package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// The end-to-end tests build the example once and run it as a subprocess
// on 127.0.0.1, speaking real HTTP to it.

var (
	binPath     string
	raceEnabled bool // set by race_test.go under -race
)

// Test databases: PostgreSQL and MariaDB on loopback, as scripts/services.sh
// provides them. A server that cannot be reached fails the test.
const (
	pgAdminDSN    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	mysqlAdminDSN = "root@tcp(127.0.0.1:3306)/"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests mostly wait on subprocesses: run more of them at once than
	// there are CPUs, unless -parallel says otherwise.
	if !flagSet("test.parallel") {
		_ = flag.Set("test.parallel", "12")
	}
	dir, err := os.MkdirTemp("", "idem-payments-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "payments")
	args := []string{"build", "-o", binPath}
	if raceEnabled {
		args = append(args, "-race")
	}
	start := time.Now()
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building the example: %v\n", err)
		os.Exit(1)
	}
	if testing.Verbose() {
		fmt.Printf("built %s (race=%v) in %v\n", binPath, raceEnabled, time.Since(start).Round(time.Millisecond))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// logBuffer keeps a subprocess's log lines.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuffer) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

// await reports whether a line containing substr is logged within d: the
// service logs a request after it answers it, so a test that has its
// answer may not yet see its line.
func (l *logBuffer) await(substr string, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(l.String(), substr) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// testFingerprintKey is the services' -fingerprint-key: the same for every
// process of a test, so that a restarted service matches the records of
// the one before.
const testFingerprintKey = "payments test fingerprint key, not a secret"

// proc is one running example process.
type proc struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:port
	logs   *logBuffer
	exited chan struct{}
}

var addrRE = regexp.MustCompile(`msg="(?:payments service|fake payment provider) listening" addr=(\S+)`)

// startService starts the example with args on a free port (-addr
// 127.0.0.1:0; the port is read from the start-up log line), waits for
// /healthz and stops it with SIGTERM when the test ends. Its log is
// printed if the test failed.
func startService(t testing.TB, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"-addr", "127.0.0.1:0", "-fingerprint-key", testFingerprintKey}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: &logBuffer{}, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.logs.add(line)
			if m := addrRE.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("log of %s:\n%s", strings.Join(args, " "), p.logs)
		}
	})
	select {
	case a := <-addr:
		p.base = "http://" + a
	case <-p.exited:
		t.Fatalf("the service exited before listening (%v): %s", cmd.ProcessState, p.logs)
	case <-time.After(90 * time.Second):
		t.Fatalf("the service did not log its address within 90s: %s", p.logs)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(p.base + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /healthz did not answer 200 within 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the process gracefully (SIGTERM), or kills it after 15s.
func (p *proc) stop(t testing.TB) {
	select {
	case <-p.exited:
		return
	default:
	}
	// Spare keep-alive connections would make a graceful shutdown wait
	// for their read timeout.
	client.CloseIdleConnections()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 && !t.Failed() {
			t.Errorf("the service exited with %d after SIGTERM", code)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("the service did not stop within 15s of SIGTERM")
		p.kill()
	}
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

var client = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true},
}

// reply is a response as the tests look at it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

func (r reply) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// problemType returns the "type" of a problem+json body, or "" when the
// response is not one.
func (r reply) problemType() string {
	if r.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct {
		Type   string
		Status int
	}
	if json.Unmarshal(r.body, &p) != nil || p.Status != r.status {
		return ""
	}
	return p.Type
}

// do sends one request. headers alternate names and values.
func do(t testing.TB, method, url, account, key, body string, headers ...string) reply {
	t.Helper()
	r, err := tryDo(method, url, account, key, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func tryDo(method, url, account, key, body string, headers ...string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return reply{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if account != "" {
		req.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// paymentJSON is a payment as the API renders it.
type paymentJSON struct {
	ID          string `json:"id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
	Status      string `json:"status"`
	CreatedAt   string `json:"created_at"`
}

func decodePayment(t testing.TB, r reply) paymentJSON {
	t.Helper()
	var p paymentJSON
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("payment body %q: %v", r.body, err)
	}
	return p
}

// listPayments returns account's payments through GET /payments.
func listPayments(t testing.TB, base, account string) []paymentJSON {
	t.Helper()
	r := do(t, "GET", base+"/payments", account, "", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /payments: %v", r)
	}
	var out struct {
		Payments []paymentJSON `json:"payments"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || out.Payments == nil {
		t.Fatalf("GET /payments body %q: %v (want {\"payments\": [...]})", r.body, err)
	}
	return out.Payments
}

// storeArgs returns the flags that start the example on store with a
// database no other test uses (newDatabase), and the DSN of the database
// the payments are written to. For redis that is a fresh SQLite file
// (-payments-db); the records go to the shared Redis, under accounts no
// other test uses.
func storeArgs(t testing.TB, store string) (args []string, paymentsDSN string) {
	t.Helper()
	dsn := newDatabase(t, store)
	args = []string{"-store", store, "-dsn", dsn}
	if store != "redis" {
		return args, dsn
	}
	path := filepath.Join(t.TempDir(), "payments.db")
	return append(args, "-payments-db", path), path
}

// redisURL is the -dsn of -store redis in the tests: the standalone Redis
// that IDEM_REDIS_ADDR names (default 127.0.0.1:6379), as for
// stores/redis's own tests.
func redisURL() string {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	return "redis://" + addr + "/0"
}

// newDatabase returns a -dsn for store that no other test uses: a fresh
// SQLite file, a fresh PostgreSQL schema or a fresh MariaDB database,
// dropped when the test ends. For redis it is the shared Redis (see
// storeArgs for its payments database).
func newDatabase(t testing.TB, store string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	name := "idem_e2e_" + randHex(6)
	switch store {
	case "memory":
		return ""
	case "redis":
		return redisURL()
	case "sqlite":
		return filepath.Join(t.TempDir(), "payments.db")
	case "pgx", "gorm-postgres":
		conn, err := pgx.Connect(ctx, pgAdminDSN)
		if err != nil {
			t.Fatalf("PostgreSQL at 127.0.0.1:5432 (db test, user postgres) is required: %v", err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if c, err := pgx.Connect(ctx, pgAdminDSN); err == nil {
				_, _ = c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE")
				_ = c.Close(ctx)
			}
		})
		return pgAdminDSN + "&search_path=" + name
	case "gorm-mysql":
		db, err := sql.Open("mysql", mysqlAdminDSN)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			t.Fatalf("MariaDB at 127.0.0.1:3306 (user root) is required: %v", err)
		}
		t.Cleanup(func() {
			if db, err := sql.Open("mysql", mysqlAdminDSN); err == nil {
				_, _ = db.Exec("DROP DATABASE " + name)
				_ = db.Close()
			}
		})
		return "root@tcp(127.0.0.1:3306)/" + name
	}
	t.Fatalf("unknown store %q", store)
	return ""
}
