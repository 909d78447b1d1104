package idemsql

import (
	"context"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
)

// settleAndCommit sends the settle's settings, the settle and COMMIT
// (pgQueries.settlePrelude, settle) to
// PostgreSQL as one simple-protocol query string: one round trip. It
// reports false, having sent nothing, when the store's driver is not one
// known to send an Exec without arguments that way (pgx's stdlib and
// lib/pq do); the caller then runs them one after the other.
//
// The values ride in the text as hex literals decoded by the server
// (pg_catalog.decode), which no standard_conforming_strings, encoding or
// search_path setting reads differently and which need no escaping, so the
// text carries nothing but the store's own SQL and hex digits. The script
// is safe because the settle raises when its fence misses
// (pgsql.Settle): the server then skips the rest of the query
// string, COMMIT included, so the handler's writes never commit without
// the outcome. On any error the transaction is rolled back or its
// connection closed (endConn), never returned to the pool with its state
// unknown. args are pgsql.Settle's, in its order.
func (t *storeTx) settleAndCommit(ctx context.Context, args []any) (bool, error) {
	if !t.store.pgScript {
		return false, nil
	}
	script, err := t.store.q.pg.settleScript(args)
	if err != nil {
		t.endConn(ctx, false)
		return true, t.store.wrap("settle", err)
	}
	if _, err := t.conn.ExecContext(ctx, script); err != nil {
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

// settleScript is the settle's query string with args, pgsql.Settle's
// $1, $2, …, in it as literals (see settleAndCommit).
func (q *pgQueries) settleScript(args []any) (string, error) {
	var failed error
	settle := placeholderRE.ReplaceAllStringFunc(q.settle, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		if n < 1 || n > len(args) {
			failed = fmt.Errorf("the settle has parameter %s, got %d arguments", p, len(args))
			return p
		}
		switch v := args[n-1].(type) {
		case string:
			return "pg_catalog.convert_from(pg_catalog.decode('" + hex.EncodeToString([]byte(v)) + "', 'hex'), 'UTF8')"
		case []byte:
			return "pg_catalog.decode('" + hex.EncodeToString(v) + "', 'hex')"
		case int:
			return strconv.Itoa(v)
		}
		failed = fmt.Errorf("settle argument %s is a %T", p, args[n-1])
		return p
	})
	if failed != nil {
		return "", failed
	}
	return q.settlePrelude + ";\n" + settle + ";\nCOMMIT", nil
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
