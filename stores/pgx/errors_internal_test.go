package idempgx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/core/idemstore"
)

func TestWrapClassifies(t *testing.T) {
	transient := []error{
		&pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "40P01"}, &pgconn.PgError{Code: "55P03"},
		&pgconn.PgError{Code: "57014"}, &pgconn.PgError{Code: "57P01"}, &pgconn.PgError{Code: "53300"},
		&pgconn.PgError{Code: "08006"}, io.ErrUnexpectedEOF, context.DeadlineExceeded,
		&net.OpError{Op: "read", Err: errors.New("connection reset")},
		fmt.Errorf("deep: %w", &pgconn.PgError{Code: "40001"}),
	}
	permanent := []error{
		&pgconn.PgError{Code: "23505"}, &pgconn.PgError{Code: "42P01"}, &pgconn.PgError{Code: "25P02"},
		&pgconn.PgError{Code: "22P02"}, context.Canceled, errors.New("closed pool"),
	}
	for _, err := range transient {
		w := wrap("claim", err)
		if !errors.Is(w, idemstore.ErrTransient) || !errors.Is(w, err) {
			t.Errorf("wrap(%v) = %v: want transient and still the original", err, w)
		}
	}
	for _, err := range permanent {
		w := wrap("claim", err)
		if errors.Is(w, idemstore.ErrTransient) || !errors.Is(w, err) {
			t.Errorf("wrap(%v) = %v: want not transient and still the original", err, w)
		}
	}
	if wrap("x", nil) != nil {
		t.Error("wrap(nil) != nil")
	}
	var pgErr *pgconn.PgError
	if w := wrap("settle", &pgconn.PgError{Code: "40001"}); !errors.As(w, &pgErr) || w.Error()[:16] != "idempgx: settle:" {
		t.Errorf("wrapped error %q lost its PgError or its prefix", w)
	}
}
