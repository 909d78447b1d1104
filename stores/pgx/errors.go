package idempgx

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/jackc/pgx/v5/pgconn"
)

// errConnClosed and errConnBusy say why the store could not use the
// transaction's connection; nothing was stored. A closed connection is
// transient: the next attempt gets another one.
var (
	errConnClosed = errors.New("the transaction's connection is closed; nothing was stored")
	errConnBusy   = errors.New("the transaction's connection is busy (rows left open?); nothing was stored")
)

// pkgName prefixes every error the store returns.
const pkgName = "idempgx"

// wrap adds the package and the operation's name to err and classifies
// it, so that errors.Is(err, idemstore.ErrTransient) holds for errors worth
// retrying and errors.Is(err, idem.ErrMisconfigured) for a missing table,
// column or schema or a missing privilege. errors.As still reaches the
// *pgconn.PgError.
func wrap(op string, err error) error {
	return idemstore.WrapStoreError(pkgName, op, classify(err), err)
}

// classify sorts err into the classes idemstore.WrapStoreError knows.
func classify(err error) idemstore.ErrorClass {
	switch {
	case err == nil:
		return idemstore.ClassOther
	case isMisconfigured(err):
		return idemstore.ClassMisconfigured
	case isTransient(err):
		return idemstore.ClassTransient
	}
	return idemstore.ClassOther
}

// isMisconfigured reports whether err is one no retry fixes, because the
// database is not set up for the store: SQLSTATE 42P01 undefined_table,
// 42703 undefined_column, 3F000 invalid_schema_name, 42501
// insufficient_privilege, 42P10 invalid_column_reference (no unique index
// on (principal, key) for ON CONFLICT), 42804 datatype_mismatch (a column
// of another type, such as an old jsonb headers column), or a
// *SchemaError from Check.
func isMisconfigured(err error) bool {
	var se *SchemaError
	if errors.As(err, &se) {
		return true
	}
	switch sqlState(err) {
	case "42P01", "42703", "3F000", "42501", "42P10", "42804":
		return true
	}
	return false
}

// isTransient reports whether err is one a retry can get past: a
// serialization failure, a deadlock, a lock or statement timeout, a server
// shutting down or refusing connections for lack of resources, or a broken
// or unreachable connection.
//
// 57014 (query_canceled) is counted as transient: it comes from
// statement_timeout or from pgx cancelling a query whose context ended, and
// in both cases the statement had no effect and may be tried again. A
// context cancelled by the caller is not transient: the caller gave up.
func isTransient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"55P03", // lock_not_available (lock_timeout, NOWAIT)
			"57014", // query_canceled (statement_timeout)
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now
			"53000", // insufficient_resources
			"53200", // out_of_memory
			"53300", // too_many_connections
			"58000", // system_error
			"58030": // io_error
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection_exception class
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, errConnClosed) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// sqlState returns err's SQLSTATE, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// connLost reports whether err says the connection broke (or could not be
// made) rather than the statement failing, while ctx is still live: the
// session is gone, and the same statement may be tried on another
// connection.
func connLost(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // the server ended the session
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	return isTransient(err)
}

// stale reports whether err says a prepared statement is gone (26000),
// no longer fits the table (0A000) or takes other parameters than it was
// prepared with (08P01): the store's own, which forget drops, or pgx's,
// which pgx drops from its cache on any error. Nothing ran; the statement
// runs again once prepared again.
func stale(err error) bool {
	switch sqlState(err) {
	case "26000", "0A000", "08P01":
		return true
	}
	return false
}
