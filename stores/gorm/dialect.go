package idemgorm

import (
	"fmt"
	"regexp"
	"strings"
)

// dialect is the SQL flavour of the database behind the *gorm.DB.
type dialect int

const (
	dialectPostgres dialect = iota + 1
	dialectMySQL
	dialectSQLite
)

func (d dialect) String() string {
	switch d {
	case dialectPostgres:
		return "postgres"
	case dialectMySQL:
		return "mysql"
	case dialectSQLite:
		return "sqlite"
	}
	return fmt.Sprintf("dialect(%d)", int(d))
}

// dialectOf maps a GORM dialector name to a dialect.
func dialectOf(name string) (dialect, error) {
	switch name {
	case "postgres", "pgx":
		return dialectPostgres, nil
	case "mysql":
		return dialectMySQL, nil
	case "sqlite", "sqlite3":
		return dialectSQLite, nil
	}
	return 0, fmt.Errorf("idemgorm: unsupported GORM dialect %q (want postgres, mysql or sqlite)", name)
}

// DefaultTable is the table the store uses unless WithTable names another.
const DefaultTable = "idempotency_keys"

// identRE is what a table name (or each part of a schema-qualified one) must
// match: lower case, so that no dialect folds or keeps case differently
// from another, and short enough for every dialect's identifier limit once
// an index suffix is added.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// tableName is a validated, possibly schema-qualified table name.
type tableName struct {
	schema string // "" when unqualified
	name   string
}

func parseTableName(s string, d dialect) (tableName, error) {
	parts := strings.Split(s, ".")
	switch {
	case len(parts) == 1 && identRE.MatchString(parts[0]):
		return tableName{name: parts[0]}, nil
	case len(parts) == 2 && d != dialectSQLite && identRE.MatchString(parts[0]) && identRE.MatchString(parts[1]):
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{}, fmt.Errorf("idemgorm: invalid table name %q: want [a-z_][a-z0-9_]* (at most 48 characters)"+
		", or schema.table on postgres and mysql", s)
}

// quote quotes an identifier that identRE (or a fixed column name) already
// vouches for, so no escaping is needed.
func (d dialect) quote(ident string) string {
	if d == dialectMySQL {
		return "`" + ident + "`"
	}
	return `"` + ident + `"`
}

func (d dialect) qualified(t tableName) string {
	if t.schema == "" {
		return d.quote(t.name)
	}
	return d.quote(t.schema) + "." + d.quote(t.name)
}

// sqliteNow is SQLite's clock as unix microseconds. SQLite keeps 'now' in
// whole milliseconds (and returns the same value for every use within one
// statement step); julianday's double carries it to within tens of
// microseconds, so rounding to the millisecond recovers it exactly.
const sqliteNow = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// nowExpr is the database clock in the form the time columns store.
func (d dialect) nowExpr() string {
	switch d {
	case dialectPostgres:
		return "now()"
	case dialectMySQL:
		return "UTC_TIMESTAMP(6)"
	default:
		return sqliteNow
	}
}

// nowOut is the database clock in the form timeValue scans.
func (d dialect) nowOut() string {
	if d == dialectMySQL {
		return d.timeOut("UTC_TIMESTAMP(6)")
	}
	return d.nowExpr()
}

// timeOut turns a stored time column into what timeValue scans: a
// timestamptz on PostgreSQL, unix microseconds elsewhere. MySQL's DATETIME
// holds UTC and is read as a number so that neither the driver's
// parseTime/loc nor the session time zone can shift it.
func (d dialect) timeOut(col string) string {
	if d == dialectMySQL {
		return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
	}
	return col
}

// nowPlus is now + one bind parameter of microseconds.
func (d dialect) nowPlus() string {
	switch d {
	case dialectPostgres:
		return "(now() + CAST(? AS bigint) * interval '1 microsecond')"
	case dialectMySQL:
		return "(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
	default:
		return "(" + sqliteNow + " + ?)"
	}
}

// nowMinus is now - one bind parameter of microseconds.
func (d dialect) nowMinus() string {
	switch d {
	case dialectPostgres:
		return "(now() - CAST(? AS bigint) * interval '1 microsecond')"
	case dialectMySQL:
		return "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)"
	default:
		return "(" + sqliteNow + " - ?)"
	}
}

// queries holds every statement of one store, built once in New.
type queries struct {
	cols string // the record's columns, in scanRecord's order (times aliased *_t)

	claimPG     string // PostgreSQL: insert or return the existing row, one statement
	insertLite  string // SQLite: INSERT … ON CONFLICT DO NOTHING RETURNING
	upsertMy    string // MySQL: INSERT … ON DUPLICATE KEY UPDATE (conditional)
	selectNow   string // the row plus the database clock
	takeExpired string // fenced takeover of an expired record
	takeStale   string // fenced takeover of a stale in-progress lease
	settle      string
	release     string
	get         string
	purge       string
	pickMy      string // MySQL: the expired batch PurgeExpired deletes by primary key
	listStale   string
}

func buildQueries(d dialect, t tableName) queries {
	T := d.qualified(t)
	K := d.quote("key")
	now := d.nowExpr()
	var q queries

	headers := "headers"
	if d == dialectPostgres {
		headers = "headers::text AS headers"
	}
	q.cols = strings.Join([]string{
		"principal", K, "fingerprint", "state", "lease_token", "request_id", "status", headers, "body",
		d.timeOut("created_at") + " AS created_t",
		d.timeOut("locked_at") + " AS locked_t",
		d.timeOut("expires_at") + " AS expires_t",
	}, ", ")
	nowCol := d.nowOut() + " AS db_now"
	insertCols := "(principal, " + K + ", fingerprint, state, lease_token, request_id, created_at, locked_at, expires_at)"
	insertVals := "VALUES (?, ?, ?, 'in_progress', ?, ?, " + now + ", " + now + ", " + d.nowPlus() + ")"

	// PostgreSQL: one round trip answers both "inserted" and "here is the
	// row that was there". The outer SELECT reads the statement's snapshot,
	// which does not contain the CTE's own insert, so exactly one branch
	// yields a row — or none, when the conflicting row committed after the
	// snapshot was taken (the INSERT waited for it). Claim loops on that.
	//
	// The claim's own commit does not wait for a WAL flush
	// (synchronous_commit off, for this statement's transaction only): the
	// row is visible to other claims at once, and the settle's synchronous
	// commit later flushes the WAL up to and including it. A claim lost in
	// a database crash took its holder's transaction with it, so the retry
	// runs afresh. A first request waits for one flush instead of two.
	q.claimPG = "WITH durability AS (SELECT set_config('synchronous_commit', 'off', true))," +
		" ins AS (INSERT INTO " + T + " " + insertCols + " " + insertVals +
		" ON CONFLICT (principal, " + K + ") DO NOTHING RETURNING " + q.cols + ")" +
		" SELECT true AS inserted, ins.*, " + nowCol + " FROM ins, durability" +
		" UNION ALL SELECT false AS inserted, " + q.cols + ", " + nowCol + " FROM " + T + ", durability" +
		" WHERE principal = ? AND " + K + " = ?"

	// SQLite: the same decision, in two statements that each answer for
	// themselves: the INSERT returns a row only when it inserted one.
	q.insertLite = "INSERT INTO " + T + " " + insertCols + " " + insertVals +
		" ON CONFLICT (principal, " + K + ") DO NOTHING RETURNING " + q.cols + ", " + nowCol

	// MySQL / MariaDB. There is no ON CONFLICT … DO NOTHING, INSERT IGNORE
	// would also swallow unrelated errors (and turn them into warnings), and
	// UPDATE has no RETURNING. So: INSERT … ON DUPLICATE KEY UPDATE whose
	// assignments change the existing row only when it is claimable because
	// it expired. Assignments run left to right and each sees the values
	// assigned before it, so the condition is evaluated exactly once, in the
	// first assignment, on the old row: lease_token becomes the caller's
	// fresh token iff the row has expired. Every later assignment asks "does
	// the row now carry my token?" — a question the first one answered — and
	// copies the new values only then. Tokens are unique per attempt, so the
	// answer cannot come from anywhere else.
	//
	// The caller's verdict is then unambiguous: it holds the key iff the row
	// carries its token (read right after, as MySQL cannot return it). Rows
	// affected corroborate it: 1 = inserted, 2 = expired row replaced,
	// 0 = existing row unchanged (a replay writes nothing) — except that with
	// clientFoundRows=true the driver reports 1 for an unchanged duplicate,
	// which is why the token, not the count, decides. A stale in-progress
	// lease is taken over separately by takeStale, as on the other dialects,
	// so that Reclaimed comes from that statement's own answer.
	mine := "lease_token = ?"
	q.upsertMy = "INSERT INTO " + T +
		" (principal, " + K + ", fingerprint, state, lease_token, request_id, status, headers, body, created_at, locked_at, expires_at)" +
		" VALUES (?, ?, ?, 'in_progress', ?, ?, NULL, NULL, NULL, " + now + ", " + now + ", " + d.nowPlus() + ")" +
		" ON DUPLICATE KEY UPDATE" +
		" lease_token = IF(expires_at <= " + now + ", ?, lease_token)," +
		" fingerprint = IF(" + mine + ", ?, fingerprint)," +
		" state = IF(" + mine + ", 'in_progress', state)," +
		" request_id = IF(" + mine + ", ?, request_id)," +
		" status = IF(" + mine + ", NULL, status)," +
		" headers = IF(" + mine + ", NULL, headers)," +
		" body = IF(" + mine + ", NULL, body)," +
		" created_at = IF(" + mine + ", " + now + ", created_at)," +
		" locked_at = IF(" + mine + ", " + now + ", locked_at)," +
		" expires_at = IF(" + mine + ", " + d.nowPlus() + ", expires_at)"

	where := " WHERE principal = ? AND " + K + " = ?"
	q.selectNow = "SELECT " + q.cols + ", " + nowCol + " FROM " + T + where
	q.get = "SELECT " + q.cols + " FROM " + T + where

	returning := ""
	if d != dialectMySQL {
		returning = " RETURNING " + q.cols + ", " + nowCol
	}
	// The takeovers are fenced by the token the caller saw and re-check
	// their condition with the database clock at the moment they run; a
	// row that changed in between matches nothing and Claim starts over.
	q.takeExpired = "UPDATE " + T + " SET fingerprint = ?, state = 'in_progress', lease_token = ?, request_id = ?," +
		" status = NULL, headers = NULL, body = NULL, created_at = " + now + ", locked_at = " + now +
		", expires_at = " + d.nowPlus() +
		where + " AND lease_token = ? AND expires_at <= " + now + returning
	q.takeStale = "UPDATE " + T + " SET lease_token = ?, request_id = ?, locked_at = " + now +
		", expires_at = " + d.nowPlus() +
		where + " AND lease_token = ? AND state = 'in_progress' AND fingerprint = ?" +
		" AND locked_at <= " + d.nowMinus() + " AND expires_at > " + now + returning

	headersIn := "?"
	if d == dialectPostgres {
		headersIn = "CAST(CAST(? AS text) AS jsonb)"
	}
	q.settle = "UPDATE " + T + " SET state = ?, status = ?, headers = " + headersIn + ", body = ?" +
		where + " AND lease_token = ? AND state = 'in_progress'"
	q.release = "DELETE FROM " + T + where + " AND lease_token = ? AND state = 'in_progress'"

	switch d {
	case dialectPostgres:
		// SKIP LOCKED lets several sweepers share the work; the outer
		// condition re-checks expiry on the row version being deleted.
		q.purge = "DELETE FROM " + T + " AS t USING (SELECT principal, " + K + " FROM " + T +
			" WHERE expires_at <= now() ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED) AS d" +
			" WHERE t.principal = d.principal AND t." + K + " = d." + K + " AND t.expires_at <= now()"
	case dialectMySQL:
		// A DELETE … ORDER BY expires_at LIMIT lets the optimizer scan the
		// primary key when most rows have expired, and InnoDB then locks
		// every row it reads, live ones included: two sweepers and a
		// settling request deadlocked that way (measured on MariaDB
		// 10.11). So the batch is picked by a plain read, which locks
		// nothing, and deleted by primary key with the expiry re-checked:
		// the DELETE locks only rows it deletes, in key order.
		q.pickMy = "SELECT principal, " + K + " FROM " + T + " WHERE expires_at <= " + now +
			" ORDER BY expires_at LIMIT ?"
		q.purge = "DELETE FROM " + T + " WHERE (principal, " + K + ") IN (%s) AND expires_at <= " + now
	default:
		q.purge = "DELETE FROM " + T + " WHERE rowid IN (SELECT rowid FROM " + T +
			" WHERE expires_at <= " + now + " ORDER BY expires_at LIMIT ?) AND expires_at <= " + now
	}
	q.listStale = "SELECT " + q.cols + " FROM " + T + " WHERE state = 'in_progress' AND locked_at <= " + d.nowMinus() +
		" ORDER BY locked_at, principal, " + K + " LIMIT ?"
	return q
}
