package idempgx_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/core/idemstore"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

const crashLease = 2 * time.Second

// TestCrashBeforeCommit: a separate process claims, begins, writes a
// business row and is SIGKILLed before it commits. The row never exists,
// the claim stays in_progress, and the key becomes claimable exactly when
// the lease expires on the database clock.
func TestCrashBeforeCommit(t *testing.T) {
	if os.Getenv("IDEMPGX_CRASH_CHILD") != "" {
		crashChild()
		return
	}
	t.Parallel()
	pool := newPool(t, 4, nil)
	e := newEnv(t, pool)
	ctx := testCtx(t)
	key, token, app := "crash-"+randHex(4), randHex(16), "idempgx-crash-"+randHex(4)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashBeforeCommit$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMPGX_CRASH_CHILD=1", "IDEMPGX_CRASH_TABLE="+e.Schema+".idempotency_keys",
		"IDEMPGX_CRASH_EFFECTS="+e.EffectsTable(), "IDEMPGX_CRASH_KEY="+key, "IDEMPGX_CRASH_TOKEN="+token,
		"IDEMPGX_CRASH_APP="+app)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "IDEMPGX-READY") || strings.HasPrefix(sc.Text(), "IDEMPGX-ERROR") {
				ready <- sc.Text()
				break
			}
		}
		close(ready)
		for sc.Scan() {
		}
	}()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "IDEMPGX-READY") {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child failed: %q", line)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child never got ready")
	}
	// The child's transaction holds its business row, uncommitted.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// Wait for the server to notice and abort the child's transaction.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed child's backend is still there after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.mustCount(t, key); n != 0 {
		t.Fatalf("the killed process's business row exists (%d)", n)
	}
	rec, err := e.Store.Get(ctx, "alice", key)
	if err != nil || rec.State != idemstore.StateInProgress || rec.LeaseToken != token {
		t.Fatalf("after the crash the record is %+v (%v), want the child's in-progress claim", rec, err)
	}

	// Poll with fresh claims until one takes over; the database clock
	// (ClaimResult.Now) of each answer says when it was decided.
	expiry := rec.LockedAt.Add(crashLease)
	var lastRefused time.Time
	refused := 0
	for {
		req := claimReq("alice", key, "body", crashLease)
		res, err := e.Store.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Claimed {
			refused++
			if !res.Now.Before(expiry) {
				t.Fatalf("claim refused at %v, at or after the lease expiry %v", res.Now, expiry)
			}
			lastRefused = res.Now
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if !res.Reclaimed {
			t.Fatalf("takeover not marked Reclaimed: %+v", res)
		}
		late := res.Now.Sub(expiry)
		if late < 0 {
			t.Fatalf("claimed at %v, %v before the lease expired", res.Now, -late)
		}
		if late > 500*time.Millisecond {
			t.Fatalf("claimed %v after the lease expired, want within the poll interval", late)
		}
		t.Logf("database clock: locked_at %s, lease %v; %d claims refused (last %v before expiry), taken over %v after expiry",
			rec.LockedAt.Format(time.RFC3339Nano), crashLease, refused, expiry.Sub(lastRefused), late)
		if err := e.runAttempt(ctx, leaseOf(req), key, "retry"); err != nil {
			t.Fatal(err)
		}
		break
	}
	if n := e.mustCount(t, key); n != 1 {
		t.Fatalf("after the retry: %d business rows, want 1", n)
	}
}

// crashChild is the subprocess: claim, begin, write, announce, wait to be
// killed.
func crashChild() {
	fail := func(err error) {
		fmt.Printf("IDEMPGX-ERROR %v\n", err)
		os.Exit(3)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		fail(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv("IDEMPGX_CRASH_APP")
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fail(err)
	}
	s, err := idempgx.New(pool, idempgx.WithTable(os.Getenv("IDEMPGX_CRASH_TABLE")))
	if err != nil {
		fail(err)
	}
	req := claimReq("alice", os.Getenv("IDEMPGX_CRASH_KEY"), "body", crashLease)
	req.Token = os.Getenv("IDEMPGX_CRASH_TOKEN")
	res, err := s.Claim(ctx, req)
	if err != nil || !res.Claimed {
		fail(fmt.Errorf("claim: %+v %v", res, err))
	}
	txCtx, _, err := s.BeginTx(ctx, leaseOf(req))
	if err != nil {
		fail(err)
	}
	tx, _ := idempgx.Tx(txCtx)
	if _, err := tx.Exec(txCtx, "INSERT INTO "+os.Getenv("IDEMPGX_CRASH_EFFECTS")+" (id) VALUES ($1)", req.Key); err != nil {
		fail(err)
	}
	fmt.Println("IDEMPGX-READY")
	time.Sleep(5 * time.Minute)
	fail(fmt.Errorf("not killed"))
}
