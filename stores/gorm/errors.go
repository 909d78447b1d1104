package idemgorm

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// wrap adds what the store was doing to err, once ("idemgorm: claim: …"),
// and marks it transient or misconfigured by what the database says (see
// classify). It returns nil for nil.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idemstore.ErrTransient) || errors.Is(err, idem.ErrMisconfigured) {
		return idemstore.WrapStoreError("idemgorm", op, idemstore.ClassOther, err)
	}
	return idemstore.WrapStoreError("idemgorm", op, errorClass(err), err)
}

// errorClass tells a transient error from a misconfiguration.
func errorClass(err error) idemstore.ErrorClass {
	switch {
	case isTransient(err):
		return idemstore.ClassTransient
	case isMisconfigured(err):
		return idemstore.ClassMisconfigured
	}
	return idemstore.ClassOther
}

// isTransient reports whether err is a serialization failure, a deadlock,
// a lock or statement timeout or a busy database: the same statement may
// succeed if it runs again.
func isTransient(err error) bool {
	if errors.Is(err, errGateTimeout) {
		return true
	}
	// PostgreSQL (pgx's *pgconn.PgError and lib/pq's *pq.Error both have
	// SQLState): serialization_failure, deadlock_detected,
	// lock_not_available (lock_timeout), query_canceled
	// (statement_timeout).
	switch sqlState(err) {
	case "40001", "40P01", "55P03", "57014":
		return true
	}
	// MySQL / MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT,
	// ER_STATEMENT_TIMEOUT (MariaDB's max_statement_time),
	// ER_QUERY_TIMEOUT (MySQL's max_execution_time).
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1213, 1205, 1969, 3024:
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

// isMisconfigured reports whether err says that the table, a column or a
// permission is missing: no retry fixes it.
func isMisconfigured(err error) bool {
	switch sqlState(err) {
	case "42P01", "42703", "42501", "3F000", "42883", "42804":
		// undefined_table, undefined_column, insufficient_privilege,
		// invalid_schema_name, undefined_function, datatype_mismatch
		return true
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1146, 1054, 1142, 1143, 1044, 1045, 1049, 1227, 1370:
			// no such table, unknown column, table/column access denied,
			// database access denied, access denied, unknown database,
			// specific access denied, routine access denied
			return true
		}
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) && lite.Code()&0xff == 8 { // SQLITE_READONLY
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") ||
		strings.Contains(msg, "has no column named")
}

func sqlState(err error) string {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}

// isFastTransient reports whether err is a transient error that the
// database raised at once (a deadlock or serialization failure), so that
// Claim may simply run its statement again. Lock timeouts and a busy SQLite
// already waited their full timeout and are returned instead.
func isFastTransient(err error) bool {
	switch sqlState(err) {
	case "40001", "40P01":
		return true
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213
	}
	return false
}

// endsTx reports whether a failed statement on the handle ended the
// transaction itself: a MySQL deadlock rolls the whole transaction back,
// and a lost connection takes it with it.
func (s *Store) endsTx(err error) bool {
	var my *mysql.MySQLError
	if errors.As(err, &my) && my.Number == 1213 {
		return true
	}
	return connGone(err)
}
