package idempgx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is returned when a handler calls Commit on the transaction it
// got from Tx: the store commits it, together with the stored outcome, when
// the handler has returned. Committing early would make the handler's writes
// permanent whether or not the outcome can be stored, which is exactly the
// double effect the store exists to prevent.
var ErrTxOwned = errors.New("idempgx: the transaction belongs to the idempotency store; return from the handler instead of committing")

// ErrHandlerRolledBack is returned by Settle when the handler rolled the
// transaction back itself: its writes are gone, so no outcome is stored.
var ErrHandlerRolledBack = errors.New("idempgx: the handler rolled the transaction back; nothing was stored")

// wrap adds the operation's name to err and, when the error is worth
// retrying, idem.ErrTransient, so that errors.Is(err, idem.ErrTransient)
// holds. errors.As still reaches the *pgconn.PgError.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if isTransient(err) {
		return fmt.Errorf("idempgx: %s: %w: %w", op, idem.ErrTransient, err)
	}
	return fmt.Errorf("idempgx: %s: %w", op, err)
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
