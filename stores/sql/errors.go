package idemsql

import (
	"errors"
	"net"
	"reflect"
	"strings"
	"syscall"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// wrap adds what the store was doing to err, once ("idemsql: claim: …"),
// and marks it transient or misconfigured by what the database says (see
// classify). It returns nil for nil.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idemstore.ErrTransient) || errors.Is(err, idem.ErrMisconfigured) {
		return idemstore.WrapStoreError("idemsql", op, idemstore.ClassOther, err)
	}
	return idemstore.WrapStoreError("idemsql", op, errorClass(err), err)
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
// a lock or statement timeout, a busy database or a server that could not
// be reached: the same statement may succeed if it runs again.
func isTransient(err error) bool {
	if errors.Is(err, errGateTimeout) {
		return true
	}
	// A connection that could not be made: nothing reached the server,
	// which may be back for the retry.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED) {
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
	if n, ok := mysqlNumber(err); ok {
		switch n {
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
	if n, ok := mysqlNumber(err); ok {
		switch n {
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

// sqlState returns the SQLSTATE of a PostgreSQL error: pgx's
// *pgconn.PgError and lib/pq's *pq.Error both have a SQLState method,
// which is how they are read without importing either.
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
	n, ok := mysqlNumber(err)
	return ok && n == 1213
}

// endsTx reports whether a failed statement on the handle ended the
// transaction itself: a MySQL deadlock rolls the whole transaction back,
// and a lost connection takes it with it.
func (s *Store) endsTx(err error) bool {
	if n, ok := mysqlNumber(err); ok && n == 1213 {
		return true
	}
	return connGone(err)
}

// The MySQL driver (github.com/go-sql-driver/mysql) reports server errors
// as *mysql.MySQLError, whose error number is a field (Number uint16) with
// no method to read it through, and a broken connection as the sentinel
// mysql.ErrInvalidConn. To classify them without importing the driver
// (which would link it into every PostgreSQL or SQLite build), the store
// recognises the driver's types by their package path and name, and reads
// the field by reflection. The tests check both against the real driver,
// so a driver release that renames them fails there.
const (
	mysqlDriverPkg   = "github.com/go-sql-driver/mysql"
	mysqlErrorType   = "MySQLError"
	mysqlInvalidText = "invalid connection" // mysql.ErrInvalidConn's text
)

// mysqlNumber returns the server error number of the first
// *mysql.MySQLError in err's chain.
func mysqlNumber(err error) (uint16, bool) {
	var n uint16
	found := walkErrors(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() {
			return false
		}
		v = v.Elem()
		t := v.Type()
		if t.Kind() != reflect.Struct || t.PkgPath() != mysqlDriverPkg || t.Name() != mysqlErrorType {
			return false
		}
		f := v.FieldByName("Number")
		if !f.IsValid() || f.Kind() != reflect.Uint16 {
			return false
		}
		n = uint16(f.Uint())
		return true
	})
	return n, found
}

// errorsNewType is the type of the errors errors.New makes, as
// mysql.ErrInvalidConn is.
var errorsNewType = reflect.TypeOf(errors.New(""))

// mysqlInvalidConn reports whether err's chain holds mysql.ErrInvalidConn:
// an error made by errors.New with its text. No other error that reaches
// the store says exactly that.
func mysqlInvalidConn(err error) bool {
	return walkErrors(err, func(e error) bool {
		return reflect.TypeOf(e) == errorsNewType && e.Error() == mysqlInvalidText
	})
}

// walkErrors calls match on err and every error it wraps (Unwrap() error
// and Unwrap() []error), depth first as errors.As does, until match
// reports true. It visits at most 64 errors.
func walkErrors(err error, match func(error) bool) bool {
	budget := 64
	var walk func(error) bool
	walk = func(e error) bool {
		for e != nil && budget > 0 {
			budget--
			if match(e) {
				return true
			}
			switch u := e.(type) {
			case interface{ Unwrap() error }:
				e = u.Unwrap()
			case interface{ Unwrap() []error }:
				for _, x := range u.Unwrap() {
					if walk(x) {
						return true
					}
				}
				return false
			default:
				return false
			}
		}
		return false
	}
	return walk(err)
}
