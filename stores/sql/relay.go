package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
	"sync"
)

// The handle's QueryContext and QueryRowContext must return *sql.Rows and
// *sql.Row, concrete types whose errors only surface while the caller reads
// them. To see those errors (a MySQL lock wait timeout on the tenth row of
// a locking read aborts the handler's transaction like any other failed
// statement) the handle runs the query on its connection and hands the
// caller rows of a small in-process driver that relays the real rows and
// reports every error it passes on.

// relayKey is the context key carrying a relayed query to relayConn.
type relayKey struct{}

// relayPayload is what one relayed query returns: rows, or an error.
type relayPayload struct {
	rows *sql.Rows
	err  error
	// seen is called with every error met while reading the rows.
	seen func(error)
}

var (
	relayOnce sync.Once
	relayPool *sql.DB
)

func relayDB() *sql.DB {
	relayOnce.Do(func() {
		relayPool = sql.OpenDB(relayConnector{})
		relayPool.SetMaxIdleConns(64)
	})
	return relayPool
}

// relayQuery returns rows (or err) as *sql.Rows that report each error
// they pass on to seen.
func relayQuery(ctx context.Context, rows *sql.Rows, err error, seen func(error)) (*sql.Rows, error) {
	if err != nil {
		return nil, err
	}
	out, rerr := relayDB().QueryContext(context.WithValue(ctx, relayKey{}, &relayPayload{rows: rows, seen: seen}), "relay")
	if rerr != nil {
		_ = rows.Close()
		return nil, rerr
	}
	return out, nil
}

// relayRow returns a *sql.Row for rows, or for err.
func relayRow(ctx context.Context, rows *sql.Rows, err error, seen func(error)) *sql.Row {
	return relayDB().QueryRowContext(context.WithValue(ctx, relayKey{}, &relayPayload{rows: rows, err: err, seen: seen}), "relay")
}

type relayConnector struct{}

func (relayConnector) Connect(context.Context) (driver.Conn, error) { return relayConn{}, nil }
func (relayConnector) Driver() driver.Driver                        { return relayDriver{} }

type relayDriver struct{}

func (relayDriver) Open(string) (driver.Conn, error) { return relayConn{}, nil }

type relayConn struct{}

func (relayConn) Prepare(string) (driver.Stmt, error) { return nil, errPreparedRefused }
func (relayConn) Close() error                        { return nil }
func (relayConn) Begin() (driver.Tx, error) {
	return nil, errors.New("idemsql: relay: no transactions")
}

func (relayConn) QueryContext(ctx context.Context, _ string, _ []driver.NamedValue) (driver.Rows, error) {
	p, _ := ctx.Value(relayKey{}).(*relayPayload)
	if p == nil {
		return nil, errors.New("idemsql: relay: no rows to relay")
	}
	if p.err != nil {
		return nil, relayErr(p.err)
	}
	cols, err := p.rows.Columns()
	if err != nil {
		_ = p.rows.Close()
		p.seen(err)
		return nil, relayErr(err)
	}
	types, _ := p.rows.ColumnTypes()
	return &relayedRows{p: p, cols: cols, types: types}, nil
}

// relayErr keeps database/sql from retrying the relay on another of its
// connections: a driver.ErrBadConn from the real connection is reported
// as a plain error.
func relayErr(err error) error {
	if errors.Is(err, driver.ErrBadConn) {
		return errConnLost{err}
	}
	return err
}

type errConnLost struct{ err error }

func (e errConnLost) Error() string { return "connection lost: " + e.err.Error() }

type relayedRows struct {
	p     *relayPayload
	cols  []string
	types []*sql.ColumnType
	vals  []any
	ptrs  []any
}

func (r *relayedRows) Columns() []string { return r.cols }
func (r *relayedRows) Close() error {
	err := r.p.rows.Close()
	if err != nil {
		r.p.seen(err)
	}
	return relayErr(err)
}

func (r *relayedRows) Next(dest []driver.Value) error {
	if !r.p.rows.Next() {
		if err := r.p.rows.Err(); err != nil {
			r.p.seen(err)
			return relayErr(err)
		}
		return io.EOF
	}
	if len(r.vals) != len(dest) {
		r.vals = make([]any, len(dest))
		r.ptrs = make([]any, len(dest))
		for i := range r.vals {
			r.ptrs[i] = &r.vals[i]
		}
	}
	if err := r.p.rows.Scan(r.ptrs...); err != nil {
		r.p.seen(err)
		return relayErr(err)
	}
	for i, v := range r.vals {
		dest[i] = v
	}
	return nil
}

func (r *relayedRows) HasNextResultSet() bool { return true }
func (r *relayedRows) NextResultSet() error {
	if !r.p.rows.NextResultSet() {
		if err := r.p.rows.Err(); err != nil {
			r.p.seen(err)
			return relayErr(err)
		}
		return io.EOF
	}
	cols, err := r.p.rows.Columns()
	if err != nil {
		r.p.seen(err)
		return relayErr(err)
	}
	r.cols = cols
	r.types, _ = r.p.rows.ColumnTypes()
	return nil
}

func (r *relayedRows) colType(i int) *sql.ColumnType {
	if i < len(r.types) {
		return r.types[i]
	}
	return nil
}

func (r *relayedRows) ColumnTypeScanType(i int) reflect.Type {
	if t := r.colType(i); t != nil && t.ScanType() != nil {
		return t.ScanType()
	}
	return reflect.TypeFor[any]()
}

func (r *relayedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t := r.colType(i); t != nil {
		return t.DatabaseTypeName()
	}
	return ""
}

func (r *relayedRows) ColumnTypeLength(i int) (int64, bool) {
	if t := r.colType(i); t != nil {
		return t.Length()
	}
	return 0, false
}

func (r *relayedRows) ColumnTypeNullable(i int) (bool, bool) {
	if t := r.colType(i); t != nil {
		return t.Nullable()
	}
	return false, false
}

func (r *relayedRows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if t := r.colType(i); t != nil {
		return t.DecimalSize()
	}
	return 0, 0, false
}
