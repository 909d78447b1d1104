package idemsql

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// pgSession holds the statements a store keeps prepared in each PostgreSQL
// session it uses through pgx's stdlib or lib/pq (Store.pgScript), with SQL
// PREPARE: database/sql cannot pipeline, so the settle and its COMMIT go
// in one simple-protocol query string, and a statement in such a string
// is parsed and planned anew on every run unless the string EXECUTEs a
// prepared one. The names carry a hash of the store's statements, so two
// stores (two tables) on one pool never share one.
//
// BEGIN executes syncMark, which tells whether the session has them:
// when it does not (a new connection, or a server session a pooler in
// transaction mode hands out for the first time), that transaction is
// begun and settled with the same statements as text, and the session
// gets them for its next one (storeTx.beginPostgres).
type pgSession struct {
	syncMark, settle string   // the names
	begin            string   // BEGIN and EXECUTE syncMark, one query string
	prepare          []string // the PREPARE statements
}

func newPGSession(settle string) pgSession {
	name := func(kind, stmt string) string {
		h := sha256.Sum256([]byte(stmt))
		return "idemsql_" + kind + "_" + hex.EncodeToString(h[:8])
	}
	// The probe's name is the store's too: BEGIN's finding it must mean
	// that this store's settle is there.
	s := pgSession{syncMark: name("sync", pgSyncMark+settle), settle: name("settle", settle)}
	s.begin = "BEGIN; EXECUTE " + s.syncMark
	s.prepare = []string{
		"PREPARE " + s.syncMark + " AS " + pgSyncMark,
		// pgsql.Settle's parameters, in its order.
		"PREPARE " + s.settle + " (pg_catalog.text, pg_catalog.text, pg_catalog.text, pg_catalog.text," +
			" pg_catalog.int4, pg_catalog.bytea, pg_catalog.bytea) AS " + settle,
	}
	return s
}

// beginPostgres begins the handler's transaction on PostgreSQL. Through
// pgx's stdlib or lib/pq BEGIN executes the session's prepared syncMark
// (pgSession); a session without it is given the store's statements
// (after the failed BEGIN is rolled back) and this transaction begins as
// text. t.prepared says which way the settle goes.
func (t *storeTx) beginPostgres(ctx context.Context) error {
	s := t.store
	if !s.pgScript {
		_, err := t.conn.ExecContext(ctx, s.dialect.beginSQL())
		return err
	}
	ps := &s.q.pg.session
	_, err := t.conn.ExecContext(ctx, ps.begin)
	if err == nil {
		t.prepared = true
		return nil
	}
	if sqlState(err) != "26000" { // invalid_sql_statement_name: not prepared in this session
		return err
	}
	if _, err := t.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		return err
	}
	for _, p := range ps.prepare {
		// 42P05: this one is there already (another was removed).
		if _, err := t.conn.ExecContext(ctx, p); err != nil && sqlState(err) != "42P05" {
			return err
		}
	}
	_, err = t.conn.ExecContext(ctx, s.dialect.beginSQL())
	return err
}

// settleAndCommit sends the settle's settings, the settle and COMMIT to
// PostgreSQL as one simple-protocol query string: one round trip. It
// reports false, having sent nothing, when the store's driver is not one
// known to send an Exec without arguments that way (pgx's stdlib and
// lib/pq do); the caller then runs them one after the other.
//
// The string is pgsql's LocalPins, the settle (pgsql.OneSettle, which pins
// synchronous_commit for the COMMIT) and COMMIT. The settle runs as the
// session's prepared statement when BEGIN found it (t.prepared), as text
// otherwise. Its values ride in the text as literals that no
// standard_conforming_strings, encoding or search_path setting reads
// differently (pgLiteral), so the text carries nothing but the store's own
// SQL, hex digits and plain ASCII. The string is safe because the settle
// raises when its fence misses (pgsql.Settle): the server then skips the
// rest of the query string, COMMIT included, so the handler's writes never
// commit without the outcome; it skips them as well when the prepared
// statement is missing. On any error the transaction is rolled back or
// its connection closed (endConn), never returned to the pool with its
// state unknown; a connection whose prepared settle was gone is closed.
// args are pgsql.Settle's, in its order.
func (t *storeTx) settleAndCommit(ctx context.Context, args []any) (bool, error) {
	if !t.store.pgScript {
		return false, nil
	}
	script, err := t.store.q.pg.settleScript(args, t.prepared)
	if err != nil {
		t.endConn(ctx, false)
		return true, t.store.wrap("settle", err)
	}
	if _, err := t.conn.ExecContext(ctx, script); err != nil {
		if sqlState(err) == "26000" {
			// The session lost the store's statements behind its back
			// (DEALLOCATE): do not pool it.
			t.mu.Lock()
			t.dirty = true
			t.mu.Unlock()
		}
		t.endConn(ctx, false)
		if isLeaseLost(err) {
			return true, idemstore.ErrLeaseLost
		}
		return true, t.store.wrap("settle", err)
	}
	// The UPDATE in the same query string succeeded, so the transaction
	// was not aborted, and the COMMIT after it committed: it failed
	// otherwise.
	t.endConn(ctx, true)
	return true, nil
}

// settleScript is settleAndCommit's query string with args, pgsql.Settle's
// $1, $2, …, as literals: an EXECUTE of the session's prepared settle, or
// with prepared false the settle's text with the literals in it.
func (q *pgQueries) settleScript(args []any, prepared bool) (string, error) {
	lits := make([]string, len(args))
	for i, a := range args {
		l, err := pgLiteral(a)
		if err != nil {
			return "", fmt.Errorf("settle argument $%d: %w", i+1, err)
		}
		lits[i] = l
	}
	var settle string
	if prepared {
		settle = "EXECUTE " + q.session.settle + "(" + strings.Join(lits, ", ") + ")"
	} else {
		var failed error
		settle = placeholderRE.ReplaceAllStringFunc(q.settleOne, func(p string) string {
			n, _ := strconv.Atoi(p[1:])
			if n < 1 || n > len(lits) {
				failed = fmt.Errorf("the settle has parameter %s, got %d arguments", p, len(lits))
				return p
			}
			return lits[n-1]
		})
		if failed != nil {
			return "", failed
		}
	}
	return q.localPins + ";\n" + settle + ";\nCOMMIT", nil
}

// pgLiteral is v as a PostgreSQL literal that reads the same under every
// session setting: a string of printable ASCII without a quote or a
// backslash as it is ('…'), which every client encoding reads as ASCII and
// standard_conforming_strings cannot change; any other string as its UTF-8
// bytes decoded by the server; bytes as a bytea in hex (E'\\x…', whose
// escapes are read the same whatever standard_conforming_strings says); an
// int in decimal.
func pgLiteral(v any) (string, error) {
	switch v := v.(type) {
	case string:
		if plainASCII(v) {
			return "'" + v + "'", nil
		}
		return "pg_catalog.convert_from(E'\\\\x" + hex.EncodeToString([]byte(v)) + "', 'UTF8')", nil
	case []byte:
		return "E'\\\\x" + hex.EncodeToString(v) + "'", nil
	case int:
		return strconv.Itoa(v), nil
	}
	return "", fmt.Errorf("a %T", v)
}

// plainASCII reports whether s is printable ASCII without a quote or a
// backslash.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '\'' || c == '\\' {
			return false
		}
	}
	return true
}

// placeholderRE matches a PostgreSQL parameter placeholder. The store's
// statements have no $ anywhere else.
var placeholderRE = regexp.MustCompile(`\$[0-9]+`)

// isLeaseLost reports whether err is the one-round-trip settle's missed
// fence: invalid_text_representation carrying pgsql.LeaseLostMarker, from pgx's
// *pgconn.PgError or lib/pq's *pq.Error alike (see sqlState).
func isLeaseLost(err error) bool {
	return sqlState(err) == "22P02" && strings.Contains(err.Error(), pgsql.LeaseLostMarker)
}
