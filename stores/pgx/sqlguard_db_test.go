package idempgx

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/stores/internal/sqlguard"
	"github.com/idemgo/idem/stores/internal/sqlguard/guardtest"
)

// TestSQLGuardAgreesWithServer is the SQL guard's differential test against
// PostgreSQL itself: each text is sent, as a simple query, inside a
// transaction that carries a marker, with standard_conforming_strings on
// and off, and the server is asked afterwards whether that transaction
// ended (the connection idle, the marker gone, or the savepoint taken
// before the text gone). Whenever it did, the guard must have found a
// transaction-control statement in the text. The texts are guardtest's
// PostgreSQL cases and random concatenations of fragments chosen to
// confuse a lexer (guardtest.Texts): IDEM_LEXER_SAMPLES of them (default
// 2000) from seed IDEM_LEXER_SEED (default 11).
func TestSQLGuardAgreesWithServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := os.Getenv("IDEM_PG_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("the SQL guard's differential test needs PostgreSQL (IDEM_PG_DSN): %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	pg := conn.PgConn()

	// ended reports whether sql, sent in a fresh transaction with
	// standard_conforming_strings set as scs, ended that transaction.
	ended := func(sql, scs string) bool {
		t.Helper()
		if err := pg.Exec(ctx, "BEGIN; SELECT set_config('idem.probe', 'x', true); SAVEPOINT probe; SET LOCAL standard_conforming_strings = "+scs).Close(); err != nil {
			t.Fatalf("set-up: %v", err)
		}
		_, _ = pg.Exec(ctx, sql).ReadAll()
		gone := false
		switch pg.TxStatus() {
		case 'I':
			gone = true
		case 'E':
			if err := pg.Exec(ctx, "ROLLBACK TO SAVEPOINT probe").Close(); err != nil {
				gone = true
			}
		}
		if !gone {
			res, err := pg.Exec(ctx, "SELECT current_setting('idem.probe', true)").ReadAll()
			gone = err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "x"
		}
		if pg.TxStatus() != 'I' {
			if err := pg.Exec(ctx, "ROLLBACK").Close(); err != nil {
				t.Fatalf("rollback: %v", err)
			}
		}
		return gone
	}

	n := 2000
	if v, err := strconv.Atoi(os.Getenv("IDEM_LEXER_SAMPLES")); err == nil && v >= 0 {
		n = v
	}
	seed := uint64(11)
	if v, err := strconv.ParseUint(os.Getenv("IDEM_LEXER_SEED"), 10, 64); err == nil {
		seed = v
	}
	texts := guardtest.Texts(sqlguard.PostgreSQL, n, seed)

	endings, overs := 0, 0
	for _, sql := range texts {
		_, found := sqlguard.TxControl(sqlguard.PostgreSQL, sql)
		for _, scs := range []string{"on", "off"} {
			if ended(sql, scs) {
				endings++
				if !found {
					t.Errorf("with standard_conforming_strings %s the server ended the transaction on %q, which the guard let through", scs, sql)
				}
			} else if found {
				overs++
			}
		}
	}
	t.Logf("%d texts, each with standard_conforming_strings on and off: the server ended the transaction %d times, the guard found every one; %d refusals where the server would not have ended it (failed or other reading)",
		len(texts), endings, overs)
}
