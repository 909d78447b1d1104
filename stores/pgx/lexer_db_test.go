package idempgx

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestLexerAgreesWithServer is the lexer's differential test against
// PostgreSQL itself: each text is sent, as a simple query, inside a
// transaction that carries a marker, with standard_conforming_strings on
// and off, and the server is asked afterwards whether that transaction
// ended (the connection idle, the marker gone, or the savepoint taken
// before the text gone). Whenever it did, the lexer must have found a
// transaction-control statement in the text. The texts are the table
// cases and random concatenations of fragments chosen to confuse a lexer
// (quotes, escapes, comments, dollar quotes, prefixes): IDEM_LEXER_SAMPLES
// of them (default 2000) from seed IDEM_LEXER_SEED (default 11).
func TestLexerAgreesWithServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := os.Getenv("IDEM_PG_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("the lexer's differential test needs PostgreSQL (IDEM_PG_DSN): %v", err)
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

	texts := make([]string, 0, len(lexerCases)+2000)
	for _, c := range lexerCases {
		texts = append(texts, c.sql)
	}
	fragments := []string{"SELECT 1", "'", "''", "E'", "e'", "\\", "\\'", "--", "\n", "\r", " ", "/*", "*/", "$$", "$a$",
		"$1", ";", "COMMIT", "commit", "ROLLBACK", "BEGIN", "TO s", "SAVEPOINT s", "AND CHAIN", "END", "\"", "B'", "X'",
		"U&'", "N'", "1e", "1", ".", "a", "x$", "\t", "\f", "-", "*", "/", "(", ")"}
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("IDEM_LEXER_SAMPLES")); err == nil && v >= 0 {
		n = v
	}
	seed := uint64(11)
	if v, err := strconv.ParseUint(os.Getenv("IDEM_LEXER_SEED"), 10, 64); err == nil {
		seed = v
	}
	rng := rand.New(rand.NewPCG(seed, 17))
	for range n {
		var b strings.Builder
		for range 2 + rng.IntN(9) {
			b.WriteString(fragments[rng.IntN(len(fragments))])
		}
		texts = append(texts, b.String())
	}

	endings, overs := 0, 0
	for _, sql := range texts {
		_, found := txControlStatement(sql)
		for _, scs := range []string{"on", "off"} {
			if ended(sql, scs) {
				endings++
				if !found {
					t.Errorf("with standard_conforming_strings %s the server ended the transaction on %q, which the lexer let through", scs, sql)
				}
			} else if found {
				overs++
			}
		}
	}
	t.Logf("%d texts, each with standard_conforming_strings on and off: the server ended the transaction %d times, the lexer found every one; %d refusals where the server would not have ended it (failed or other reading)",
		len(texts), endings, overs)
}
