package idemgorm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
)

// transientError marks a driver error as worth retrying while keeping it
// (and so its driver type) reachable through errors.As.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }

func (e *transientError) Unwrap() []error { return []error{idem.ErrTransient, e.err} }

// wrap adds what the store was doing to err and marks it transient when the
// database says that retrying can succeed. It returns nil for nil.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if isTransient(err) && !errors.Is(err, idem.ErrTransient) {
		err = &transientError{err}
	}
	return fmt.Errorf("idemgorm: %s: %w", op, err)
}

// isTransient reports whether err is a serialization failure, a deadlock,
// a lock timeout or a busy database: the same statement may succeed if it
// runs again.
func isTransient(err error) bool {
	// PostgreSQL (pgx's *pgconn.PgError and lib/pq's *pq.Error both have
	// SQLState): serialization_failure, deadlock_detected,
	// lock_not_available (lock_timeout).
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		switch pg.SQLState() {
		case "40001", "40P01", "55P03":
			return true
		}
	}
	// MySQL / MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1213, 1205:
			return true
		}
	}
	// SQLite (modernc and glebarez drivers expose Code()): SQLITE_BUSY and
	// SQLITE_LOCKED, with their extended codes (BUSY_SNAPSHOT, …).
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		switch lite.Code() & 0xff {
		case 5, 6:
			return true
		}
	}
	// mattn/go-sqlite3 keeps its code in a field; its messages are stable.
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "database table is locked")
}

// isFastTransient reports whether err is a transient error that the
// database raised at once (a deadlock or serialization failure), so that
// Claim may simply run its statement again. Lock timeouts and a busy SQLite
// already waited their full timeout and are returned instead.
func isFastTransient(err error) bool {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		s := pg.SQLState()
		return s == "40001" || s == "40P01"
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213
	}
	return false
}
