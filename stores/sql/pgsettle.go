package idemsql

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemgo/idem/core/idemstore"
)

// leaseLostMarker is in the error the one-round-trip settle raises when its
// fence misses (queries.settlePipe): it is not a valid integer, which is how
// it raises.
const leaseLostMarker = "idemsql lease lost"

// settleAndCommit sends the settle's settings, the settle and COMMIT to
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
// (queries.settlePipe): the server then skips the rest of the query
// string, COMMIT included, so the handler's writes never commit without
// the outcome. On any error the transaction is rolled back or its
// connection closed (endConn), never returned to the pool with its state
// unknown. args are the settle's, in queries.settle's order.
func (t *storeTx) settleAndCommit(ctx context.Context, args []any) (bool, error) {
	if !t.store.pgScript {
		return false, nil
	}
	script, err := t.store.q.settleScript(args)
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

// settleScript is the settle's query string with args in it as literals
// (see settleAndCommit).
func (q *queries) settleScript(args []any) (string, error) {
	parts := q.settleScriptParts
	if len(parts) != len(args)+1 {
		return "", fmt.Errorf("the settle takes %d arguments, got %d", len(parts)-1, len(args))
	}
	var b strings.Builder
	for i, a := range args {
		b.WriteString(parts[i])
		switch v := a.(type) {
		case string:
			b.WriteString("pg_catalog.convert_from(pg_catalog.decode('" + hex.EncodeToString([]byte(v)) + "', 'hex'), 'UTF8')")
		case []byte:
			b.WriteString("pg_catalog.decode('" + hex.EncodeToString(v) + "', 'hex')")
		case int:
			b.WriteString(strconv.Itoa(v))
		default:
			return "", fmt.Errorf("settle argument %d is a %T", i, a)
		}
	}
	b.WriteString(parts[len(args)])
	return b.String(), nil
}

// isLeaseLost reports whether err is the one-round-trip settle's missed
// fence: invalid_text_representation carrying leaseLostMarker, from pgx's
// *pgconn.PgError or lib/pq's *pq.Error alike (see sqlState).
func isLeaseLost(err error) bool {
	return sqlState(err) == "22P02" && strings.Contains(err.Error(), leaseLostMarker)
}
