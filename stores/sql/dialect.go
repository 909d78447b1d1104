package idemsql

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem/stores/internal/pgsql"
	"github.com/idemgo/idem/stores/internal/sqlguard"
)

// dialect is the SQL flavour of the database behind the *sql.DB.
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

// dialectOf maps a dialect name (as WithDialect and GORM name it) to a dialect.
func dialectOf(name string) (dialect, error) {
	switch name {
	case "postgres", "pgx":
		return dialectPostgres, nil
	case "mysql":
		return dialectMySQL, nil
	case "sqlite", "sqlite3":
		return dialectSQLite, nil
	}
	return 0, fmt.Errorf("idemsql: unsupported dialect %q (want postgres, mysql or sqlite)", name)
}

// beginSQL starts the handler's transaction. SQLite's is IMMEDIATE: it
// takes the write lock at once, so a transaction that read first can never
// fail to upgrade (SQLITE_BUSY_SNAPSHOT, which no busy timeout retries).
func (d dialect) beginSQL() string {
	switch d {
	case dialectMySQL:
		return "START TRANSACTION"
	case dialectSQLite:
		return "BEGIN IMMEDIATE"
	}
	return "BEGIN; " + pgSyncMark
}

// pgSyncMark keeps the WAL insert position right after BEGIN in the
// transaction: it is past the claim's commit record (the claim returned
// before the transaction began) and before any write of the handler's,
// which is what pgTx.Sync waits for. It runs in BEGIN's round trip.
const pgSyncMark = "SELECT " + pgsql.SyncMark

// DefaultTable is the table the store uses unless WithTable names another.
// The store qualifies it (and any unqualified WithTable name) in New: on
// PostgreSQL with current_schema() (public by default), on MySQL with the
// DSN's database, on SQLite with main, so that a handler's search_path,
// USE or TEMP table cannot point the store's statements elsewhere.
const DefaultTable = pgsql.DefaultTable

// identRE is what a MySQL or SQLite table name (or each part of a
// schema-qualified MySQL one) must match: lower case, so that neither
// folds or keeps case differently from the other, and short enough for
// their identifier limits once an index suffix is added. PostgreSQL's
// names are pgsql.ParseTable's.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// tableName is a validated, possibly schema-qualified table name.
type tableName struct {
	schema string // "" when unqualified
	name   string
}

// pg is t as package pgsql names a table.
func (t tableName) pg() pgsql.Table { return pgsql.Table{Schema: t.schema, Name: t.name} }

func parseTableName(s string, d dialect) (tableName, error) {
	if d == dialectPostgres {
		// PostgreSQL's names follow the rules idempgx's do: the table
		// part leaves room for the index names derived from it.
		t, err := pgsql.ParseTable(s)
		if err != nil {
			return tableName{}, fmt.Errorf("idemsql: %w", err)
		}
		return tableName{schema: t.Schema, name: t.Name}, nil
	}
	parts := strings.Split(s, ".")
	switch {
	case len(parts) == 1 && identRE.MatchString(parts[0]):
		return tableName{name: parts[0]}, nil
	case len(parts) == 2 && d == dialectMySQL && identRE.MatchString(parts[0]) && identRE.MatchString(parts[1]):
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{}, fmt.Errorf("idemsql: invalid table name %q: want [a-z_][a-z0-9_]* (at most 48 characters)"+
		", or schema.table on mysql", s)
}

// quote quotes an identifier that identRE (or a fixed column name) already
// vouches for, so no escaping is needed. Backticks on MySQL, which read the
// same whatever ANSI_QUOTES says.
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

// timeOut turns a time column (or the clock) into unix microseconds, which
// timeValue scans: no session setting (TimeZone, DateStyle, time_zone)
// and no driver option (parseTime, loc) can change an integer.
func (d dialect) timeOut(col string) string {
	switch d {
	case dialectPostgres:
		return "CAST(EXTRACT(EPOCH FROM " + col + ") * 1000000 AS bigint)"
	case dialectMySQL:
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

// bind turns the ? placeholders of a store query into the dialect's own.
// The store's queries carry no ? inside literals.
func (d dialect) bind(q string) string {
	if d != dialectPostgres {
		return q
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// queries holds every statement of one store, built once in New, with the
// dialect's placeholders.
type queries struct {
	cols string // the record's columns, in recordRow's order

	pg pgQueries // PostgreSQL: package pgsql's statements

	insertLite  string // SQLite: INSERT … ON CONFLICT DO NOTHING RETURNING
	upsertMy    string // MySQL: INSERT … ON DUPLICATE KEY UPDATE (conditional)
	upsertMyRet string // MariaDB 10.5+: upsertMy returning the row it left; "" elsewhere
	selectNow   string // the row plus the database clock
	takeExpired string // fenced takeover of an expired record
	takeStale   string // fenced takeover of an in-progress record whose lease ended
	takeFreed   string // fenced claim of a released record
	settle      string
	release     string
	keep        string
	held        string // SQLite: whether a lease still holds its row, read before Release or Keep takes the write turn
	get         string
	purge       string
	pickMy      string // MySQL: the expired batch PurgeExpired deletes by primary key
	listStale   string
}

// pgQueries are the PostgreSQL statements that package pgsql builds for
// idempgx too, in their one-statement forms (pgsql.OneClaim, OneUpdate,
// OneSelect): each runs its prelude inside it, in one round trip. The
// claim and the takeovers come in two forms, indexed by
// idemstore.ClaimRequest.Durable: behind pgsql's ClaimPrelude (its commit
// does not wait for the WAL flush) and behind its DurablePrelude, the
// claim behind their InsertPrelude and DurableInsertPrelude.
// Release runs behind the plain prelude, Keep behind the durable one. They
// return pgsql.RecordCols (recordRow.destPG).
type pgQueries struct {
	claim, takeover, replace, reuse [2]string
	release, keep, get, listStale   string
	purge                           string // pgsql.Purge, run as it is: it returns no values, and skips the rows it would wait for
	selectNow                       string // the row and now(), as the claim's second branch reads it

	// The settle on a driver that is not one of simpleQueryDrivers:
	// settlePrelude pins, for the rest of the handler's transaction, the
	// settings the settle and its COMMIT run under (synchronous_commit at
	// least on among them: the outcome is durable when Settle returns),
	// then settle, pgsql.Settle, which raises with pgsql.LeaseLostMarker
	// when its fence misses; each is a statement of its own.
	settlePrelude, settle string

	// The settle in one simple-protocol query string (settleAndCommit):
	// localPins, then settleOne, pgsql.Settle that pins synchronous_commit
	// itself, run as the session's prepared statement (pgSession), then
	// COMMIT.
	localPins, settleOne string
	session              pgSession
}

// pgBuild builds the PostgreSQL statements for the qualified table t.
func pgBuild(t tableName, lock time.Duration) pgQueries {
	// Values travel as text with lib/pq, and with pgx's stdlib in its
	// simple-protocol modes: the statements return times in their binary
	// form (pgTime) and pin the text format of bytea.
	st := pgsql.New(t.pg(), pgsql.Options{LockTimeout: lock, StatementTimeout: 2 * lock, TextFormats: true, SendTimes: true})
	pre := [2]string{st.ClaimPrelude, st.DurablePrelude}
	// A search_path pinned inside a statement applies only after the
	// statement was parsed; the claim's statements name their schemas and
	// go without it.
	claimPre := [2]string{st.InsertPrelude, st.DurableInsertPrelude}
	var q pgQueries
	for i, p := range pre {
		q.claim[i] = st.OneClaim(claimPre[i])
		q.takeover[i] = pgsql.OneUpdate(p, st.Takeover)
		q.replace[i] = pgsql.OneUpdate(p, st.Replace)
		q.reuse[i] = pgsql.OneUpdate(p, st.Reuse)
	}
	q.release = pgsql.OneUpdate(st.Prelude, st.Release)
	q.keep = pgsql.OneUpdate(st.DurablePrelude, st.Keep)
	q.get = pgsql.OneSelect(st.Prelude, st.Get)
	q.listStale = pgsql.OneSelect(st.Prelude, st.ListStale)
	q.selectNow = pgsql.OneSelect(st.Prelude, st.ClaimRead)
	// The settle names its schemas, so its prelude leaves the search_path
	// to the handler: deferred work at COMMIT (a constraint trigger) runs
	// under it.
	q.settlePrelude, q.settle = st.DurableInsertPrelude, st.Settle
	// The one-round-trip settle returns an integer only: no text format
	// changes what it reads or returns, so it pins none.
	q.localPins, q.settleOne = st.LocalPins, st.OneSettle("SELECT "+pgsql.DurableCommit)
	q.session = newPGSession(q.settleOne)
	q.purge = st.Purge
	return q
}

// mysqlTimeouts is MariaDB's per-statement prefix bounding lock waits and
// run time; "" for MySQL, where Store.mysqlSession sets the session
// variable instead (MySQL has no SET STATEMENT, and its SET_VAR hint does
// not take innodb_lock_wait_timeout).
func mysqlTimeouts(maria bool, lock time.Duration) string {
	if !maria {
		return ""
	}
	return fmt.Sprintf("SET STATEMENT innodb_lock_wait_timeout = %d, max_statement_time = %d FOR ",
		mysqlLockSeconds(lock), 2*mysqlLockSeconds(lock))
}

// mysqlLockSeconds is the lock timeout in InnoDB's whole seconds, at least 1.
func mysqlLockSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// buildQueries builds the store's statements. maria selects MariaDB's
// per-statement timeouts; mariaRt (MariaDB 10.5+) adds the claim
// upsert that returns its row.
func buildQueries(d dialect, t tableName, maria, mariaRt bool, lock time.Duration) queries {
	T := d.qualified(t)
	K := d.quote("key")
	now := d.nowExpr()
	var q queries

	q.cols = strings.Join([]string{
		"principal", K, "fingerprint", "state", "lease_token", "request_id", "nonce", "status", "headers", "body",
		d.timeOut("created_at"), d.timeOut("locked_at"), d.timeOut("lease_expires_at"), d.timeOut("expires_at"), "uncertain",
	}, ", ")
	nowCol := d.timeOut(now) + " AS db_now"
	// A new row's lease ends at now + its lease (the first bind parameter
	// of nowPlus), its retention at now + its retention (the second);
	// uncertain takes its default, false.
	insertCols := "(principal, " + K + ", fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at)"
	insertVals := "VALUES (?, ?, ?, 'in_progress', ?, ?, ?, " + now + ", " + now + ", " + d.nowPlus() + ", " + d.nowPlus() + ")"
	my := ""
	if d == dialectMySQL {
		my = mysqlTimeouts(maria, lock)
	}

	// SQLite: the same decision, in two statements that each answer for
	// themselves: the INSERT returns a row only when it inserted one. It
	// returns only the clock it wrote and the token: every other column of
	// the row it inserted is the caller's own value (claimSQLite). The
	// driver compiles each statement every time it runs, and returning the
	// whole row and the clock as well made this statement's compile cost
	// about three times the rest of the INSERT (measured with
	// modernc.org/sqlite 1.23).
	q.insertLite = "INSERT INTO " + T + " " + insertCols + " " + insertVals +
		" ON CONFLICT (principal, " + K + ") DO NOTHING RETURNING created_at, lease_token"

	// MySQL / MariaDB. There is no ON CONFLICT … DO NOTHING, INSERT IGNORE
	// would also swallow unrelated errors (and turn them into warnings), and
	// UPDATE has no RETURNING. So: INSERT … ON DUPLICATE KEY UPDATE whose
	// assignments change the existing row only when it has expired. Every
	// assignment asks the same question of the old row, "expires_at <=
	// now", and expires_at is assigned last: by default assignments run
	// left to right and see the values assigned before them, under
	// MariaDB's SIMULTANEOUS_ASSIGNMENT they all see the old row, and in
	// both every assignment but the last reads the old expires_at, while
	// UTC_TIMESTAMP(6) is one value for the whole statement. So the row is
	// replaced whole (its lease deadline and its uncertain mark included),
	// or not touched at all. Every other claimable row (a released one, an
	// in-progress one whose lease ended) is left to the fenced takeovers
	// below, whose conditions read other columns.
	//
	// The caller's verdict is then unambiguous: it holds the key iff the
	// row carries its token (read right after, as MySQL cannot return it).
	// Rows affected corroborate it: 1 = inserted, 2 = expired row
	// replaced, 0 = existing row unchanged (a replay writes nothing) —
	// except that with clientFoundRows=true the driver reports 1 for an
	// unchanged duplicate, which is why the token, not the count, decides.
	expired := "expires_at <= " + now
	set := func(col, val string) string { return col + " = IF(" + expired + ", " + val + ", " + col + ")" }
	q.upsertMy = my + "INSERT INTO " + T +
		" (principal, " + K + ", fingerprint, state, lease_token, request_id, nonce, status, headers, body, created_at, locked_at, lease_expires_at, expires_at)" +
		" VALUES (?, ?, ?, 'in_progress', ?, ?, ?, NULL, NULL, NULL, " + now + ", " + now + ", " + d.nowPlus() + ", " + d.nowPlus() + ")" +
		" ON DUPLICATE KEY UPDATE " + strings.Join([]string{
		set("lease_token", "?"),
		set("fingerprint", "?"),
		set("state", "'in_progress'"),
		set("request_id", "?"),
		set("nonce", "?"),
		set("status", "NULL"),
		set("headers", "NULL"),
		set("body", "NULL"),
		set("uncertain", "FALSE"),
		set("created_at", now),
		set("locked_at", now),
		set("lease_expires_at", d.nowPlus()),
		set("expires_at", d.nowPlus()), // last: every assignment before it reads the old value
	}, ", ")
	// MariaDB 10.5+: the same upsert returns the row it leaves — inserted,
	// replaced, or the existing one untouched — as of its own write, with
	// its clock: one statement where MySQL needs the upsert and a SELECT.
	if d == dialectMySQL && mariaRt {
		q.upsertMyRet = q.upsertMy + " RETURNING " + q.cols + ", " + nowCol
	}

	where := " WHERE principal = ? AND " + K + " = ?"
	// LIMIT 1: MySQL's sql_select_limit, which a handler can leave on a
	// pooled connection, does not apply to a SELECT with its own LIMIT.
	q.selectNow = "SELECT " + q.cols + ", " + nowCol + " FROM " + T + where + " LIMIT 1"
	q.get = "SELECT " + q.cols + " FROM " + T + where + " LIMIT 1"

	returning := ""
	if d != dialectMySQL {
		returning = " RETURNING " + q.cols + ", " + nowCol
	}
	// The takeovers are fenced by the token the caller saw and re-check
	// their condition with the database clock at the moment they run; a
	// row that changed in between matches nothing and Claim starts over.
	// (Keep changes uncertain and lease_expires_at under the same token,
	// so the stale takeover re-checks both.) An expired row is replaced
	// whole, its nonce included. A stale claim keeps its nonce, so the
	// taken-over attempt's downstream keys, and its uncertain mark; it is
	// taken over only when its own lease has ended, and an uncertain one
	// only when the caller asks for it (the last bind parameter).
	q.takeExpired = my + "UPDATE " + T + " SET fingerprint = ?, state = 'in_progress', lease_token = ?, request_id = ?, nonce = ?," +
		" status = NULL, headers = NULL, body = NULL, uncertain = FALSE, created_at = " + now + ", locked_at = " + now +
		", lease_expires_at = " + d.nowPlus() + ", expires_at = " + d.nowPlus() +
		where + " AND lease_token = ? AND expires_at <= " + now + returning
	q.takeStale = my + "UPDATE " + T + " SET lease_token = ?, request_id = ?, locked_at = " + now +
		", lease_expires_at = " + d.nowPlus() + ", expires_at = " + d.nowPlus() +
		where + " AND lease_token = ? AND state = 'in_progress' AND fingerprint = ?" +
		" AND lease_expires_at <= " + now + " AND expires_at > " + now + " AND (NOT uncertain OR ?)" + returning
	// A released row is free: the new attempt's fingerprint, token, lease
	// and retention replace the old. The nonce stays when the fingerprint
	// is the same, so the released attempt's downstream keys are reused by
	// its retry; another request gets its own. The nonce is assigned
	// before the fingerprint, so that it compares the old fingerprint on
	// every dialect: MySQL's UPDATE runs its assignments left to right,
	// each seeing the values assigned before it (unless MariaDB's
	// SIMULTANEOUS_ASSIGNMENT, where all see the old row, as they always
	// do on PostgreSQL and SQLite).
	q.takeFreed = my + "UPDATE " + T + " SET nonce = CASE WHEN fingerprint = ? THEN nonce ELSE ? END," +
		" fingerprint = ?, state = 'in_progress', lease_token = ?, request_id = ?, uncertain = FALSE," +
		" created_at = " + now + ", locked_at = " + now + ", lease_expires_at = " + d.nowPlus() + ", expires_at = " + d.nowPlus() +
		where + " AND lease_token = ? AND state = 'released' AND expires_at > " + now + returning

	held := where + " AND lease_token = ? AND state = 'in_progress'"
	q.release = my + "UPDATE " + T + " SET state = 'released', uncertain = FALSE" + held
	// Keep ends the lease now, so the record is stale at once, and marks it
	// uncertain, so that only a claim that asks Reconcile takes it over.
	q.keep = my + "UPDATE " + T + " SET uncertain = TRUE, lease_expires_at = " + now + held
	q.held = "SELECT 1 FROM " + T + held + " LIMIT 1"
	settle := "UPDATE " + T + " SET state = ?, status = ?, headers = ?, body = ?, uncertain = FALSE" + held
	q.settle = my + settle

	switch d {
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
		q.purge = my + "DELETE FROM " + T + " WHERE (principal, " + K + ") IN (%s) AND expires_at <= " + now
	default:
		q.purge = "DELETE FROM " + T + " WHERE rowid IN (SELECT rowid FROM " + T +
			" WHERE expires_at <= " + now + " ORDER BY expires_at LIMIT ?) AND expires_at <= " + now
	}
	q.listStale = "SELECT " + q.cols + " FROM " + T + " WHERE state = 'in_progress' AND lease_expires_at <= " + now +
		" ORDER BY lease_expires_at, principal, " + K + " LIMIT ?"

	for _, p := range []*string{&q.insertLite, &q.upsertMy, &q.upsertMyRet, &q.selectNow,
		&q.takeExpired, &q.takeStale, &q.takeFreed, &q.settle, &q.release, &q.keep, &q.held,
		&q.get, &q.purge, &q.pickMy, &q.listStale} {
		*p = d.bind(*p)
	}
	if d == dialectPostgres {
		q.pg = pgBuild(t, lock)
		q.selectNow = q.pg.selectNow
	}
	return q
}

// guard is d as the shared SQL guard names it.
func (d dialect) guard() sqlguard.Dialect {
	switch d {
	case dialectPostgres:
		return sqlguard.PostgreSQL
	case dialectMySQL:
		return sqlguard.MySQL
	}
	return sqlguard.SQLite
}
