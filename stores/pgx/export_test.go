package idempgx

import (
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"
)

// ClaimSQL exposes the claim statement to the tests, which run it inside a
// transaction to ask PostgreSQL whether it assigned a transaction id.
func ClaimSQL(s *Store) string { return s.sql.Claim }

// ClaimReruns reports how often Claim ran its statement again.
func ClaimReruns(s *Store) int64 { return s.reruns.Load() }

// TxControlStatement exposes the SQL guard's verdict to the external tests.
func TxControlStatement(sql string) (string, bool) { return txControl(sql) }

// RawConn returns the connection under h, unfiltered, which no method of
// the handle hands out: the tests end the transaction on it behind the
// handle, to prove that the store detects it.
func RawConn(h *Handle) *pgx.Conn { return h.rawConn() }

// ScanRecord scans the row rows is on as the store does; with generic,
// through pgx's type map alone (the scanner's fallback). With now, the
// row's last column is now().
func ScanRecord(rows pgx.Rows, now, generic bool) (idem.Record, time.Time, error) {
	var t time.Time
	s := &recordScanner{}
	if now {
		s.now = &t
	}
	var err error
	if generic {
		err = s.scanGeneric(rows)
	} else {
		err = rows.Scan(s)
	}
	return s.rec, t, err
}

// StatementNames returns the names under which the store prepares its
// statements on each connection, in the default exec mode.
func StatementNames(s *Store) []string { return append([]string(nil), s.directNames[:]...) }
