package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	_ "github.com/glebarez/go-sqlite"
	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemgo/idem/core/idemstore"
)

// TestDriverErrorsWithoutTheDrivers: the store classifies the real
// drivers' errors without importing them — MySQL's *mysql.MySQLError and
// mysql.ErrInvalidConn by type and field, wrapped once, twice or joined;
// the SQLSTATE of pgx's and lib/pq's errors from a real server — and
// nothing else passes for them.
func TestDriverErrorsWithoutTheDrivers(t *testing.T) {
	deadlock := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	for _, err := range []error{deadlock, fmt.Errorf("a: %w", fmt.Errorf("b: %w", deadlock)), errors.Join(errors.New("x"), deadlock)} {
		if n, ok := mysqlNumber(err); !ok || n != 1213 || !isFastTransient(err) || errorClass(err) != idemstore.ClassTransient {
			t.Errorf("%v: number %d, %v; fast transient %v", err, n, ok, isFastTransient(err))
		}
	}
	if !connGone(fmt.Errorf("exec: %w", mysql.ErrInvalidConn)) {
		t.Error("mysql.ErrInvalidConn is not a lost connection")
	}
	for _, err := range []error{errors.New("Error 1213: Deadlock found"), fmt.Errorf("invalid connection %d", 1), nil} {
		if _, ok := mysqlNumber(err); ok || connGone(err) {
			t.Errorf("%v passes for a MySQL driver error", err)
		}
	}

	ctx := context.Background()
	for driver, dsn := range map[string]string{
		"pgx":      pgTestDSN,
		"postgres": pgTestDSN,
		"mysql":    "root@tcp(127.0.0.1:3306)/test",
	} {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "SELECT * FROM idem_no_such_table")
		if err == nil || !isMisconfigured(err) || errorClass(err) != idemstore.ClassMisconfigured {
			t.Errorf("%s: no such table = %v, not misconfigured", driver, err)
		}
	}
}

// TestDriverDetection: New names the dialect by the driver's package, and
// takes the one-round-trip settle on the PostgreSQL drivers that send an
// argument-less Exec as a simple query.
func TestDriverDetection(t *testing.T) {
	for driver, want := range map[string]string{"pgx": "postgres", "postgres": "postgres", "mysql": "mysql", "sqlite": "sqlite"} {
		dsn := map[string]string{"pgx": pgTestDSN, "postgres": pgTestDSN, "mysql": "root@tcp(127.0.0.1:3306)/test",
			"sqlite": t.TempDir() + "/d.db"}[driver]
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		s, err := New(db, WithTable("idem_detect"))
		if err != nil {
			t.Fatalf("%s: %v", driver, err)
		}
		if s.Dialect() != want || s.pgScript != (want == "postgres") {
			t.Errorf("%s: dialect %s, one-round-trip settle %v; want %s", driver, s.Dialect(), s.pgScript, want)
		}
	}
}

const pgTestDSN = "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
