package idemgorm

import (
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
//   - _txlock=immediate: every transaction takes the write lock when it
//     begins, so a transaction that read first can never fail to upgrade to
//     a writer (SQLITE_BUSY_SNAPSHOT, which no busy timeout retries).
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
// reads through the base *gorm.DB would wait for itself.
func SQLiteDSN(path string, busyTimeout time.Duration) string {
	if busyTimeout <= 0 {
		busyTimeout = 10 * time.Second
	}
	return path + "?_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")" +
		"&_pragma=journal_mode(WAL)&_txlock=immediate"
}
