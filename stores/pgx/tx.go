package idempgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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

// BeginTx implements idem.Store. It acquires a pool connection and runs
// BEGIN ISOLATION LEVEL READ COMMITTED on a context detached from ctx's
// cancellation (bounded by WithTxTimeout), so that a cancelled request
// cannot strand the transaction half-way. The returned context carries the
// transaction for Tx.
func (s *Store) BeginTx(ctx context.Context, l idem.Lease) (context.Context, idem.Tx, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.txTimeout)
	defer cancel()
	var (
		conn *pgxpool.Conn
		tx   pgx.Tx
	)
	// BEGIN is safe to repeat on another connection when one broke.
	err := s.onConn(bctx, func() error {
		c, err := s.pool.Acquire(bctx)
		if err != nil {
			return err
		}
		t, err := c.BeginTx(bctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			c.Release() // destroyed by the pool unless idle
			return err
		}
		conn, tx = c, t
		return nil
	})
	if err != nil {
		return ctx, nil, wrap("begin", err)
	}
	st := &storeTx{store: s, lease: l, conn: conn}
	st.handler = &handlerTx{tx: tx, owner: st}
	return context.WithValue(ctx, txKey{}, st.handler), st, nil
}

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
	b.Queue(t.store.sql.settle, t.lease.Principal, t.lease.Key, t.lease.Token,
		string(out.State), int32(out.Response.Status), string(headers), body)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	// The statement returns 1 or raises; there is no third answer, so a
	// nil error here means exactly one row was updated.
	var one int
	updErr := br.QueryRow().Scan(&one)
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
	// Committed. pgx's own Tx still believes it is open; it is never used
	// again (the handler's view is closed), and the connection is idle, so
	// it goes back to the pool without another round trip.
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

// handlerTx is the pgx.Tx a handler gets from Tx. It forwards to pgx's
// transaction until the store finishes it, refuses Commit, and turns
// Rollback into "store nothing".
type handlerTx struct {
	tx    pgx.Tx
	owner *storeTx

	mu         sync.Mutex
	closed     bool
	rolledBack bool
}

// close marks the handler's view finished and reports whether the handler
// rolled back.
func (h *handlerTx) close() (rolledBack bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.rolledBack
}

func (h *handlerTx) open() (pgx.Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, pgx.ErrTxClosed
	}
	return h.tx, nil
}

// Begin starts a savepoint inside the store's transaction. The savepoint
// is closed, like the transaction, once the store has finished it.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := h.open()
	if err != nil {
		return nil, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{sp: sp, root: h}, nil
}

// Commit refuses: the store commits the transaction with the outcome.
func (h *handlerTx) Commit(context.Context) error {
	if _, err := h.open(); err != nil {
		return err
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
	tx, err := h.open()
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := h.open()
	if err != nil {
		return errBatch{err}
	}
	return tx.SendBatch(ctx, b)
}

func (h *handlerTx) LargeObjects() pgx.LargeObjects { return h.tx.LargeObjects() }

func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := h.open()
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := h.open()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := h.open()
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := h.open()
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (h *handlerTx) Conn() *pgx.Conn { return h.tx.Conn() }

// savepointTx is a savepoint inside a handlerTx: Commit releases it and
// Rollback rolls back to it, as in pgx, while the store's transaction is
// open; afterwards every method returns pgx.ErrTxClosed.
type savepointTx struct {
	sp   pgx.Tx
	root *handlerTx
}

func (s *savepointTx) inner() (pgx.Tx, error) {
	if _, err := s.root.open(); err != nil {
		return nil, err
	}
	return s.sp, nil
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.inner()
	if err != nil {
		return nil, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{sp: sp, root: s.root}, nil
}

func (s *savepointTx) Commit(ctx context.Context) error {
	tx, err := s.inner()
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	tx, err := s.inner()
	if err != nil {
		return err
	}
	return tx.Rollback(ctx)
}

func (s *savepointTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	tx, err := s.inner()
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := s.inner()
	if err != nil {
		return errBatch{err}
	}
	return tx.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.sp.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := s.inner()
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := s.inner()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := s.inner()
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := s.inner()
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.sp.Conn() }

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
