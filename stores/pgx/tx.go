package idempgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	idem "github.com/idemgo/idem/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

type txKey struct{}

// Tx returns the transaction BeginTx put into ctx, for the handler's own
// queries. ok is false when ctx carries none (the request was not claimed,
// for instance when the idempotency key is optional and absent).
//
// The store owns the transaction: it commits it together with the stored
// response after the handler returns, or rolls it back. Commit returns
// ErrTxOwned and does nothing. Rollback rolls the handler's work back and
// makes the settle fail, so nothing is stored and the key is released; to
// abandon work, return an error (or a 5xx) instead. Savepoints (Begin)
// work as in pgx. Once the store has finished the transaction, every method
// returns pgx.ErrTxClosed, except Conn and LargeObjects, which reach the
// connection directly: do not keep what they return past the handler.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	t, ok := ctx.Value(txKey{}).(*handlerTx)
	if !ok || t == nil {
		return nil, false
	}
	return t, true
}

// BeginTx implements idem.Store. It acquires a pool connection (on a
// context detached from ctx's cancellation, bounded by WithTxTimeout) and
// returns a context carrying the transaction for Tx. BEGIN ISOLATION LEVEL
// READ COMMITTED is not sent on its own: it goes to the server in one
// pipelined batch with the handler's first statement, or with the settle
// when the handler sent none. A first request thus costs the claim, the
// handler's statements and the settle with its COMMIT, and no round trip
// for BEGIN.
func (s *Store) BeginTx(ctx context.Context, l idem.Lease) (context.Context, idem.Tx, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.txTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(bctx)
	if err != nil {
		return ctx, nil, wrap("begin", err)
	}
	st := &storeTx{store: s, lease: l, conn: conn}
	st.handler = &handlerTx{conn: conn.Conn(), owner: st}
	return context.WithValue(ctx, txKey{}, st.handler), st, nil
}

// beginSQL starts every handler's transaction. READ COMMITTED is explicit:
// the claim's concurrency argument needs it whatever the server's default.
const beginSQL = "begin isolation level read committed"

// storeTx is the idem.Tx the engine drives.
type storeTx struct {
	store   *Store
	lease   idem.Lease
	handler *handlerTx

	mu   sync.Mutex
	conn *pgxpool.Conn // nil once finished and returned to the pool
}

// Settle implements idem.Tx. The fenced UPDATE and the COMMIT go to the
// server as one pipelined batch: one round trip. When the fence misses the
// UPDATE raises an error, so the server never runs the COMMIT; the
// transaction is rolled back and Settle returns idem.ErrLeaseLost. A
// transaction an earlier statement aborted (a handler that swallowed an
// error), a COMMIT answered with ROLLBACK, or any other failure returns an
// error and stores nothing; it never reports success unless the server
// confirmed the COMMIT after the UPDATE changed exactly one row.
func (t *storeTx) Settle(ctx context.Context, out idem.Outcome) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return errors.New("idempgx: settle: transaction already finished")
	}
	if t.handler.close() {
		t.rollbackLocked(ctx)
		return ErrHandlerRolledBack
	}
	if out.State != idem.StateCompleted && out.State != idem.StateFailed {
		t.rollbackLocked(ctx)
		return fmt.Errorf("idempgx: settle: invalid outcome state %q", out.State)
	}
	hdr := out.Response.Header
	if hdr == nil {
		hdr = http.Header{}
	}
	headers, err := json.Marshal(hdr)
	if err != nil {
		t.rollbackLocked(ctx)
		return fmt.Errorf("idempgx: settle: encode headers: %w", err)
	}
	body := out.Response.Body
	if body == nil {
		body = []byte{}
	}

	b := &pgx.Batch{}
	begin := !t.handler.began() // the handler sent no statement: BEGIN goes first
	if begin {
		b.Queue(beginSQL)
	}
	b.Queue(t.store.sql.settle, t.lease.Principal, t.lease.Key, t.lease.Token,
		string(out.State), int32(out.Response.Status), string(headers), body)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	var updErr error
	if begin {
		_, updErr = br.Exec()
	}
	// The statement returns 1 or raises; there is no third answer, so a
	// nil error here means exactly one row was updated.
	var one int
	if updErr == nil {
		updErr = br.QueryRow().Scan(&one)
	}
	var commitTag pgconn.CommandTag
	var commitErr error
	if updErr == nil {
		commitTag, commitErr = br.Exec()
	}
	closeErr := br.Close()

	switch {
	case updErr != nil:
		t.rollbackLocked(ctx)
		var pgErr *pgconn.PgError
		if errors.As(updErr, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, leaseLostMarker) {
			return idem.ErrLeaseLost
		}
		if sqlState(updErr) == "25P02" {
			return fmt.Errorf("idempgx: settle: the transaction was aborted by an earlier failed statement, nothing was stored: %w", updErr)
		}
		return wrap("settle", updErr)
	case commitErr != nil:
		// The outcome of a COMMIT whose answer was lost is unknown to us;
		// the caller releases (a no-op if it did commit: the row is no
		// longer in_progress) and the retry finds out which.
		t.rollbackLocked(ctx)
		return wrap("settle: commit", commitErr)
	case commitTag.String() != "COMMIT":
		t.rollbackLocked(ctx)
		return fmt.Errorf("idempgx: settle: commit: %w (server answered %q)", pgx.ErrTxCommitRollback, commitTag.String())
	case closeErr != nil:
		t.rollbackLocked(ctx)
		return wrap("settle: commit", closeErr)
	}
	// Committed. The connection is idle, so it goes back to the pool
	// without another round trip.
	t.conn.Release()
	t.conn = nil
	return nil
}

// Rollback implements idem.Tx. It is a no-op once the transaction is
// finished (after Settle, or a previous Rollback). It runs on a context
// detached from ctx's cancellation; if the ROLLBACK fails the connection is
// closed, which makes the server abort the transaction.
func (t *storeTx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return nil
	}
	t.handler.close()
	return t.rollbackLocked(ctx)
}

// rollbackLocked rolls back and returns the connection to the pool, which
// destroys it unless it is idle. Callers hold t.mu.
func (t *storeTx) rollbackLocked(ctx context.Context) error {
	t.handler.close()
	conn := t.conn
	t.conn = nil
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.store.txTimeout)
	defer cancel()
	var err error
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_, err = conn.Exec(rctx, "ROLLBACK")
	}
	if err != nil {
		// Leave no doubt about the transaction: close the connection.
		_ = conn.Conn().Close(rctx)
	}
	conn.Release()
	return wrap("rollback", err)
}

// handlerTx is the pgx.Tx a handler gets from Tx. It runs the handler's
// statements on the transaction's connection, sending BEGIN in one
// pipelined batch with the first of them; refuses Commit; and turns
// Rollback into "store nothing". Savepoints are its own (savepointTx).
type handlerTx struct {
	conn  *pgx.Conn
	owner *storeTx

	mu         sync.Mutex
	begun      bool   // BEGIN was sent (and answered)
	closed     bool   // the store finished the transaction, or the handler rolled back
	rolledBack bool   // the handler called Rollback
	savepoints int    // savepoints created, for their names
	lo         pgx.Tx // pgx's own view of the transaction, for LargeObjects only
}

// close marks the handler's view finished and reports whether the handler
// rolled back.
func (h *handlerTx) close() (rolledBack bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.rolledBack
}

// began reports whether BEGIN was sent.
func (h *handlerTx) began() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.begun
}

// use runs fn with the connection while the transaction is open. When
// BEGIN has not been sent, fn gets begin = true and must send it first,
// pipelined with its own statement, and report whether it did; otherwise
// fn sends its statement as it is.
func (h *handlerTx) use(fn func(begin bool) (begun bool)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return pgx.ErrTxClosed
	}
	if fn(!h.begun) {
		h.begun = true
	}
	return nil
}

// begin sends BEGIN on its own if it has not gone out yet, for the calls
// that cannot carry it in a batch (CopyFrom, Prepare, savepoints, the
// connection handed out by Conn).
func (h *handlerTx) begin(ctx context.Context) error {
	var err error
	if uerr := h.use(func(begin bool) bool {
		if !begin {
			return true
		}
		_, err = h.conn.Exec(ctx, beginSQL)
		return err == nil
	}); uerr != nil {
		return uerr
	}
	return err
}

// withBegin sends BEGIN and sql in one batch and reads BEGIN's answer.
// The caller reads sql's result from br and closes it; on an error br is
// already closed.
func (h *handlerTx) withBegin(ctx context.Context, sql string, args []any) (br pgx.BatchResults, err error) {
	b := &pgx.Batch{}
	b.Queue(beginSQL)
	b.Queue(sql, args...)
	br = h.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	return br, nil
}

// pipelinable reports whether args can go into a pgx.Batch as they are:
// Exec and Query also take a QueryExecMode, a QueryRewriter or a result
// format as their first argument, which a batch does not.
func pipelinable(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// Begin starts a savepoint inside the store's transaction. The savepoint
// is closed, like the transaction, once the store has finished it.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return h.savepoint(ctx)
}

func (h *handlerTx) savepoint(ctx context.Context) (pgx.Tx, error) {
	if err := h.begin(ctx); err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.savepoints++
	name := "idem_sp_" + strconv.Itoa(h.savepoints)
	h.mu.Unlock()
	if _, err := h.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{root: h, name: name}, nil
}

// Commit refuses: the store commits the transaction with the outcome.
func (h *handlerTx) Commit(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return pgx.ErrTxClosed
	}
	return ErrTxOwned
}

// Rollback rolls the handler's work back: the transaction is marked so that
// the settle stores nothing, and closed for further use. The server-side
// ROLLBACK happens when the store finishes the transaction.
func (h *handlerTx) Rollback(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.closed, h.rolledBack = true, true
	return nil
}

func (h *handlerTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := h.begin(ctx); err != nil {
		return 0, err
	}
	var (
		n   int64
		err error
	)
	if uerr := h.use(func(bool) bool {
		n, err = h.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
		return true
	}); uerr != nil {
		return 0, uerr
	}
	return n, err
}

func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var br pgx.BatchResults
	if err := h.use(func(begin bool) bool {
		if !begin {
			br = h.conn.SendBatch(ctx, b)
			return true
		}
		withBegin := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: beginSQL}}, b.QueuedQueries...)}
		br = h.conn.SendBatch(ctx, withBegin)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			br = errBatch{err}
			return false
		}
		return true
	}); err != nil {
		return errBatch{err}
	}
	return br
}

// LargeObjects needs pgx's own transaction type, which only pgx's BeginTx
// makes: it sends BEGIN (a round trip; inside a transaction begun by a
// pipelined statement the server answers it with a warning). This rarely
// used call is the only one that does. BeginTx fails only on a broken
// connection; the handler then panics with the error, which releases the
// key like any panic (LargeObjects has no error to return). After the
// store finished the transaction the connection may serve another request,
// so a first LargeObjects call then panics with pgx.ErrTxClosed.
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lo == nil && h.closed {
		panic(fmt.Errorf("idempgx: LargeObjects: %w", pgx.ErrTxClosed))
	}
	if h.lo == nil {
		ctx, cancel := context.WithTimeout(context.Background(), h.owner.store.txTimeout)
		defer cancel()
		tx, err := h.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			h.rolledBack = true
			panic(fmt.Errorf("idempgx: LargeObjects: begin: %w", err))
		}
		h.lo, h.begun = tx, true
	}
	return h.lo.LargeObjects()
}

func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	var (
		sd  *pgconn.StatementDescription
		err error
	)
	if uerr := h.use(func(bool) bool {
		// Preparing needs no transaction; BEGIN waits for a statement.
		sd, err = h.conn.Prepare(ctx, name, sql)
		return false
	}); uerr != nil {
		return nil, uerr
	}
	return sd, err
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var (
		tag pgconn.CommandTag
		err error
	)
	if !pipelinable(args) {
		if err := h.begin(ctx); err != nil {
			return tag, err
		}
	}
	if uerr := h.use(func(begin bool) bool {
		if !begin {
			tag, err = h.conn.Exec(ctx, sql, args...)
			return true
		}
		br, berr := h.withBegin(ctx, sql, args)
		if berr != nil {
			err = berr
			return false
		}
		tag, err = br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return true
	}); uerr != nil {
		return tag, uerr
	}
	return tag, err
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var (
		rows pgx.Rows
		err  error
	)
	if !pipelinable(args) {
		if err := h.begin(ctx); err != nil {
			return nil, err
		}
	}
	if uerr := h.use(func(begin bool) bool {
		if !begin {
			rows, err = h.conn.Query(ctx, sql, args...)
			return true
		}
		br, berr := h.withBegin(ctx, sql, args)
		if berr != nil {
			err = berr
			return false
		}
		var inner pgx.Rows
		if inner, err = br.Query(); err != nil {
			_ = br.Close()
			return true
		}
		rows = &batchRows{Rows: inner, br: br}
		return true
	}); uerr != nil {
		return nil, uerr
	}
	return rows, err
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := h.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return queryRow{rows}
}

// Conn returns the transaction's connection, with BEGIN sent, so that what
// the handler runs on it is part of the transaction. Do not keep it past
// the handler.
func (h *handlerTx) Conn() *pgx.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), h.owner.store.txTimeout)
	defer cancel()
	if err := h.begin(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		// Nothing run on the connection may commit on its own: the
		// settle stores nothing for a handler whose BEGIN failed.
		h.mu.Lock()
		h.rolledBack = true
		h.mu.Unlock()
	}
	return h.conn
}

// batchRows are the rows of a handler's first query, which went out
// pipelined behind BEGIN: closing them also closes the batch, which must
// happen before the connection can run anything else.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// queryRow is pgx's QueryRow over Rows: Scan reads the first row and
// closes the rows.
type queryRow struct{ rows pgx.Rows }

func (r queryRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// savepointTx is a savepoint inside a handlerTx: Commit releases it and
// Rollback rolls back to it, as pgx's savepoints do, while the store's
// transaction is open; afterwards, or once it is released or rolled back,
// every method returns pgx.ErrTxClosed.
type savepointTx struct {
	root   *handlerTx
	name   string
	mu     sync.Mutex
	closed bool
}

func (s *savepointTx) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return pgx.ErrTxClosed
	}
	return nil
}

func (s *savepointTx) end(ctx context.Context, sql string) error {
	if err := s.open(); err != nil {
		return err
	}
	_, err := s.root.Exec(ctx, sql+s.name)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return err
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.savepoint(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error { return s.end(ctx, "release savepoint ") }

func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "rollback to savepoint ")
}

func (s *savepointTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	return s.root.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := s.open(); err != nil {
		return errBatch{err}
	}
	return s.root.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.root.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.open(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.root.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.open(); err != nil {
		return errRow{err}
	}
	return s.root.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.root.Conn() }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

var (
	_ pgx.Tx = (*handlerTx)(nil)
	_ pgx.Tx = (*savepointTx)(nil)
)
