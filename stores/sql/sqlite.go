package idemsql

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// SQLiteDSN returns a DSN for github.com/glebarez/sqlite (and the
// modernc.org/sqlite driver under it) that makes a file database fit for
// concurrent requests:
//
//   - journal_mode(WAL): readers never block the writer nor the writer
//     the readers;
//   - busy_timeout: a writer that finds the write lock taken waits up to
//     busyTimeout for it instead of failing at once with SQLITE_BUSY;
//   - _txlock=immediate: every transaction GORM begins takes the write
//     lock when it begins, so a transaction that read first can never fail
//     to upgrade to a writer (SQLITE_BUSY_SNAPSHOT, which no busy timeout
//     retries). The store's own transactions begin IMMEDIATE whatever the
//     DSN says.
//
// SQLite has one writer at a time. With this DSN each idempotent request
// holds the write lock from BeginTx until Settle or Rollback, and every
// other write — claims of other requests included — queues behind it for up
// to busyTimeout. Throughput is one handler at a time; keep handlers short
// and use PostgreSQL or MySQL when requests must write concurrently. A
// zero busyTimeout means 10 seconds. path must not contain '?'.
//
// Keep the connection pool larger than one (the default is unlimited): the
// handler's transaction holds a connection while the engine and other
// requests need others; with SetMaxOpenConns(1) a request whose handler
// reads through the *sql.DB would wait for itself.
func SQLiteDSN(path string, busyTimeout time.Duration) string {
	if busyTimeout <= 0 {
		busyTimeout = 10 * time.Second
	}
	return path + "?_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")" +
		"&_pragma=journal_mode(WAL)&_txlock=immediate"
}

// writeGate queues this process's SQLite writers in order. SQLite lets one
// connection write at a time and makes the others poll: its busy handler
// sleeps 1, 2, 5, … up to 100 ms between tries, so under contention the
// lock is often free while everyone sleeps, and an unlucky writer can wait
// far longer than the rest. The gate hands the turn over directly, first
// come first served, so the store's own writers (claims, transactions,
// releases, purges) never poll each other. It changes nothing about
// atomicity: SQLite's lock still decides, and still serialises writers in
// other processes and outside the store. A writer that cannot get its turn
// within the busy timeout fails as transient, as SQLITE_BUSY would.
type writeGate struct {
	turn chan struct{}
	wait time.Duration
}

func newWriteGate(wait time.Duration) *writeGate {
	return &writeGate{turn: make(chan struct{}, 1), wait: wait}
}

// errGateTimeout is returned (as transient) when a writer waited the busy
// timeout for its turn.
var errGateTimeout = errors.New("sqlite: waited the busy timeout for the write lock")

func (g *writeGate) acquire(ctx context.Context) error {
	select {
	case g.turn <- struct{}{}:
		return nil
	default:
	}
	timer := time.NewTimer(g.wait)
	defer timer.Stop()
	select {
	case g.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return errGateTimeout
	}
}

func (g *writeGate) release() { <-g.turn }

// sqliteBusyTimeout reads the connection's busy timeout, to wait as long for
// the gate as SQLite would wait for its lock.
func sqliteBusyTimeout(s *Store) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := s.pool()
	if err != nil {
		return 5 * time.Second
	}
	var ms int64
	if err := pool.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil || ms <= 0 {
		return 5 * time.Second
	}
	return time.Duration(ms) * time.Millisecond
}
