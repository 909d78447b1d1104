package idempgx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/stores/internal/pgsql"
	"github.com/idemgo/idem/stores/internal/sqlguard"
)

type txKey struct{}

// Tx returns the handle on the transaction BeginTx put into ctx, for the
// handler's own queries. ok is false when ctx carries none (the request was
// not claimed, for instance when the idempotency key is optional and
// absent). ctx may be a framework's own context an adapter stored the
// attempt in (see idem.AttemptContext).
//
// The handle has no Commit, Rollback or Conn: the store commits the
// transaction together with the stored outcome after the handler returns
// (see Handle).
func Tx(ctx context.Context) (*Handle, bool) {
	ctx, _ = idem.AttemptContext(ctx)
	h, ok := ctx.Value(txKey{}).(*Handle)
	if !ok || h == nil {
		return nil, false
	}
	return h, true
}

// BeginTx implements idemstore.Store. It acquires a pool connection for
// the transaction and sends nothing: BEGIN (READ COMMITTED READ WRITE) and
// the statement that sets the transaction up go out with the handler's
// first statement, in one round trip (see Handle), or in front of the
// settle of a handler that ran none. The setup sets, for the transaction
// only, a random marker Settle checks and the WAL position Sync waits for,
// and on a connection where no settle committed them yet, for the
// session, the TCP keepalive settings of DeadPeerTimeout. The wait for the
// connection ends with ctx (the engine bounds it by StoreTimeout) and is
// bounded by WithTxTimeout. It returns a context carrying the transaction
// for Tx.
func (s *Store) BeginTx(ctx context.Context, l idemstore.Lease) (context.Context, idemstore.Tx, error) {
	// The wait for a connection honours ctx: the engine bounds it by
	// StoreTimeout, so an exhausted pool answers 503 instead of queueing.
	actx, cancel := context.WithTimeout(ctx, s.txTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(actx)
	if err != nil {
		return ctx, nil, wrap("begin", err)
	}
	st := &storeTx{store: s, lease: l, marker: newMarker(), conn: conn}
	st.h = &Handle{pool: conn, txConn: conn.Conn(), setup: s.beginSetup(conn), owner: st}
	return context.WithValue(ctx, txKey{}, st.h), st, nil
}

// txOptions begin the handler's transaction: READ COMMITTED, as the
// claim's concurrency argument needs whatever the server's default, and
// READ WRITE, whatever a handler left in default_transaction_read_only.
var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadWrite}

// beginSetup returns the statement that sets up a transaction on c behind
// its BEGIN: pgsql's BeginSetup, or BeginPeerSetup where c is not known to
// have the dead-peer settings. They are the session's once a settle on the
// connection committed them (see pgsql.DeadPeer.Pins); until this
// transaction's settle commits, the connection is not known to have them
// any more: a transaction that ends otherwise may have been the one that
// set them, and is taken back with them.
func (s *Store) beginSetup(c *pgxpool.Conn) string {
	data := c.Conn().PgConn().CustomData()
	known := data[deadPeerKey] == s.deadPeer
	delete(data, deadPeerKey)
	if known {
		return s.sql.BeginSetup
	}
	return s.sql.BeginPeerSetup
}

// newMarker returns the random value BeginTx puts into leaseSetting. It is
// hex, so it goes into SQL text as it is.
func newMarker() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// rawSavepoint is the savepoint rawConn sets before it hands out the raw
// connection. In an aborted transaction it is the only way to ask the
// server whether the transaction is still the one BeginTx began: ROLLBACK
// TO it succeeds only in that transaction.
const rawSavepoint = "idem_raw"

// abortSQL fails on the server, which aborts the transaction: what a
// refused statement does, so that the transaction behaves as if the
// refused statement had failed.
const abortSQL = "SELECT 'idempgx: a statement that would end the transaction was refused; the transaction is aborted'::int"

// errTxEnded is what the handle answers once the transaction ended by a
// route it could not refuse (see Handle).
var errTxEnded = fmt.Errorf("idempgx: %w: the transaction ended outside the handle; nothing more runs through it", idemstore.ErrTxEnded)

// storeTx is the idemstore.Tx the engine drives.
type storeTx struct {
	store  *Store
	lease  idemstore.Lease
	marker string
	h      *Handle

	mu   sync.Mutex
	conn *pgxpool.Conn // nil once finished and returned to the pool
}

// Used implements idemstore.Tx: whether the handler ran, or tried to run,
// anything through the handle or its savepoints, or took a savepoint's
// large objects.
func (t *storeTx) Used() bool {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	return t.h.used
}

// Settle implements idemstore.Tx. The marker check and pinned settings, the
// fenced UPDATE and COMMIT go to the server as one pipelined batch: one
// round trip. The COMMIT waits for its WAL flush whatever the handler set
// synchronous_commit to (see settleCheck), so a stored outcome is durable
// once the client is answered. A store with a subscription (Subscribe)
// queues its pg_notify in the same batch, before the COMMIT. It never reports success unless the server
// confirmed the COMMIT after the UPDATE changed exactly one row in the
// transaction BeginTx began. Otherwise nothing is stored and it returns:
//
//   - idemstore.ErrLeaseLost when the fence missed (the UPDATE raises, so the
//     server skips the queued COMMIT);
//   - an error wrapping idemstore.ErrTxAborted when a statement failed (or was
//     refused) and left the transaction aborted;
//   - an error wrapping idemstore.ErrTxEnded when the transaction ended behind
//     the handle (TxStatus idle, or another transaction with another
//     marker): part of the handler's work may have committed, so the
//     engine keeps the claim (Keep), and a Release of this lease changes
//     nothing;
//   - any other failure, wrapped.
func (t *storeTx) Settle(ctx context.Context, out idemstore.Outcome) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return errors.New("idempgx: settle: transaction already finished")
	}
	f := t.h.close()
	if t.conn = t.h.pool; t.conn == nil {
		return wrap("settle", errConnClosed)
	}
	if out.State != idemstore.StateCompleted && out.State != idemstore.StateFailed {
		if ended, _ := t.abandon(ctx, f); ended {
			return fmt.Errorf("idempgx: settle: %w", errTxEnded)
		}
		return fmt.Errorf("idempgx: settle: invalid outcome state %q", out.State)
	}
	pg := t.conn.Conn().PgConn()
	if f.begun && (f.ended || pg.IsBusy() || pg.IsClosed() || pg.TxStatus() != 'T') {
		status := pg.TxStatus()
		ended, err := t.abandon(ctx, f)
		switch {
		case ended:
			return fmt.Errorf("idempgx: settle: %w", errTxEnded)
		case f.refused:
			// The handler tried to end the store's transaction: its doing,
			// which a retry repeats (idemstore.ErrTxOwned), not a failed commit.
			return fmt.Errorf("idempgx: settle: %w: %w", idemstore.ErrTxAborted, idemstore.ErrTxOwned)
		case status == 'E':
			return fmt.Errorf("idempgx: settle: %w", idemstore.ErrTxAborted)
		}
		return wrap("settle", err)
	}

	hdr := out.Response.Header
	if hdr == nil {
		hdr = http.Header{}
	}
	body := out.Response.Body
	if body == nil {
		body = []byte{}
	}
	var checkErr, updErr, commitErr, closeErr error
	var commitTag pgconn.CommandTag
	if t.store.direct && !t.store.hub.Publishing() && f.begun {
		checkErr, updErr, commitTag, commitErr = t.settleDirect(ctx, out, idemstore.EncodeHeader(hdr), body)
	} else {
		checkErr, updErr, commitTag, commitErr, closeErr = t.settleBatch(ctx, &f, out, idemstore.EncodeHeader(hdr), body)
	}

	switch {
	case checkErr != nil:
		if hasMarker(checkErr, pgsql.TxEndedMarker) {
			f.ended = true
		}
		if ended, _ := t.abandon(ctx, f); ended {
			return fmt.Errorf("idempgx: settle: %w: %w", errTxEnded, checkErr)
		}
		return wrap("settle", checkErr)
	case updErr != nil:
		ended, _ := t.abandon(ctx, f)
		switch {
		case ended:
			return fmt.Errorf("idempgx: settle: %w: %w", errTxEnded, updErr)
		case hasMarker(updErr, pgsql.LeaseLostMarker):
			return idemstore.ErrLeaseLost
		case sqlState(updErr) == "25P02":
			return fmt.Errorf("idempgx: settle: %w: %w", idemstore.ErrTxAborted, updErr)
		}
		return wrap("settle", updErr)
	case commitErr != nil:
		// The outcome of a COMMIT whose answer was lost is unknown to us;
		// the caller releases (a no-op if it did commit: the row is no
		// longer in_progress) and the retry finds out which.
		_, _ = t.abandon(ctx, f)
		return wrap("settle: commit", commitErr)
	case commitTag.String() != "COMMIT":
		_, _ = t.abandon(ctx, f)
		return fmt.Errorf("idempgx: settle: commit: %w (server answered %q)", pgx.ErrTxCommitRollback, commitTag.String())
	case closeErr != nil:
		_, _ = t.abandon(ctx, f)
		return wrap("settle: commit", closeErr)
	}
	// Committed. The connection is idle, so it goes back to the pool
	// without another round trip. Large objects a savepoint handed out hold
	// pgx's own transaction, which does not know the batch committed: it
	// is closed (a ROLLBACK outside a transaction, answered with a
	// warning), so that they answer pgx.ErrTxClosed instead of running on
	// a connection another request may hold.
	if f.loUsed {
		rctx, cancel := t.store.detached(ctx)
		_ = t.h.real.Rollback(rctx)
		cancel()
	}
	// The settle's check set the dead-peer settings for the session, and
	// its COMMIT kept them.
	t.conn.Conn().PgConn().CustomData()[deadPeerKey] = t.store.deadPeer
	t.conn.Release()
	t.conn = nil
	return nil
}

// settleBatch sends the settle as a pgx.Batch: where the direct path does
// not apply (exec modes other than the default, a store whose settles
// notify) and for a handler that ran nothing through the handle, whose
// transaction has not begun: BEGIN and its setup then go in front, in the
// same batch, and run again, at most maxConnRetries times, when they met
// a prepared statement gone stale. Callers hold t.mu.
func (t *storeTx) settleBatch(ctx context.Context, f *handleState, out idemstore.Outcome, headers, body []byte) (checkErr, updErr error, commitTag pgconn.CommandTag, commitErr, closeErr error) {
	pg := t.conn.Conn().PgConn()
	for tries := 0; ; tries++ {
		checkErr, updErr, commitErr, closeErr = nil, nil, nil, nil
		begin := !f.begun
		b := newBatch()
		if begin {
			b.BeginTx(txOptions)
			b.queue(t.h.setup, t.marker)
		}
		b.queue(t.store.sql.SettleCheck, t.marker)
		b.queue(t.store.sql.Settle, t.lease.Principal, t.lease.Key, t.lease.Token,
			string(out.State), int32(out.Response.Status), headers, body)
		notified := t.store.queueNotify(&b.Batch, t.lease.Principal, t.lease.Key)
		b.queue("COMMIT")
		br := t.conn.SendBatch(ctx, &b.Batch)
		var setupErr error
		if begin {
			if _, setupErr = br.Exec(); setupErr == nil {
				f.begun = t.h.started(br.Tx())
				_, setupErr = br.Exec()
			}
			checkErr = setupErr
		}
		if checkErr == nil {
			_, checkErr = br.Exec()
		}
		// The UPDATE's statement returns 1 or raises; there is no third
		// answer, so a nil error means exactly one row was updated.
		if checkErr == nil {
			var one int
			updErr = br.QueryRow().Scan(&one)
		}
		if checkErr == nil && updErr == nil && notified {
			_, updErr = br.Exec()
		}
		if checkErr == nil && updErr == nil {
			commitTag, commitErr = br.Exec()
		}
		closeErr = br.Close()
		if !f.begun && (pg.IsClosed() || pg.TxStatus() != 'I') {
			f.begun = t.h.started(br.Tx())
		}
		if !begin || tries >= maxConnRetries || !stale(setupErr) || pg.IsClosed() {
			return checkErr, updErr, commitTag, commitErr, closeErr
		}
		if t.store.rollbackOpen(ctx, pg) != nil {
			return checkErr, updErr, commitTag, commitErr, closeErr
		}
		f.begun = false
	}
}

// rollbackOpen rolls back what pg has open, if anything, before BEGIN and
// the setup that met a stale statement are sent again: on a context
// detached from ctx's cancellation, bounded by WithTxTimeout.
func (s *Store) rollbackOpen(ctx context.Context, pg *pgconn.PgConn) error {
	if pg.TxStatus() == 'I' {
		return nil
	}
	rctx, cancel := s.detached(ctx)
	defer cancel()
	return pg.Exec(rctx, "ROLLBACK").Close()
}

// detached returns a context for the store's own statements on a
// transaction's connection: not cancelled with ctx, bounded by
// WithTxTimeout.
func (s *Store) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.txTimeout)
}

// deadPeerKey is the key, in a connection's pgconn.PgConn.CustomData, of
// the pgsql.DeadPeer settings its session is known to have.
const deadPeerKey = "idempgx.deadPeer"

// Sync implements idemstore.Syncer: it returns once the WAL is flushed up to
// the position BeginTx read when the transaction began, which is past the
// claim's commit record (the claim committed before BeginTx was called),
// so the claim, and the nonce every downstream key is made of, survives a
// database crash (pgsql.WaitFlushed). idem.DownstreamKey calls it before it
// hands out the first key of an attempt whose claim was not Durable.
//
// It runs on the transaction's own connection, never on another one from
// the pool: its statements take the handle's turn, as the handler's own
// do, and read positions only, so the transaction is left as it was. The
// wait ends with ctx; a statement already sent is not cancelled, as a
// cancelled statement would abort the handler's transaction, so Sync may
// return up to one statement after ctx ends.
//
// When the flush stalls short of that position (another session wrote
// after the claim and keeps its transaction open, and nothing on the server
// commits), Sync commits a transaction of its own, with
// synchronous_commit on, through the pool, when the pool has an idle
// connection or room for a new one at that moment: it does not wait for a
// connection another request holds.
//
// It fails, without waiting, when the transaction is finished or aborted,
// ended behind the handle (an error wrapping idemstore.ErrTxEnded), or its
// connection is busy with rows the handler left open.
func (t *storeTx) Sync(ctx context.Context) error {
	return wrap("sync", pgsql.WaitFlushed(ctx, t.syncQuery, t.store.nudge))
}

// nudge is Sync's pgsql.Nudge: pgsql.NudgeSQL through the pool, within
// pgsql.NudgeTimeout, when the pool has an idle connection or room for a
// new one.
func (s *Store) nudge(ctx context.Context) {
	if st := s.pool.Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, pgsql.NudgeTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, pgsql.NudgeSQL)
}

// syncQuery is Sync's pgsql.QueryRow: it runs one of Sync's statements
// under the locks Settle and the handle's statements take, on a
// transaction that is open, idle and not aborted.
func (t *storeTx) syncQuery(ctx context.Context, query string, dest ...any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return errors.New("transaction already finished")
	}
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return pgx.ErrTxClosed
	}
	if err := h.begin(ctx); err != nil {
		return err
	}
	pg := h.txConn.PgConn()
	switch {
	case pg.IsBusy():
		return errSyncBusy
	case h.state.ended || pg.TxStatus() == 'I':
		h.state.ended = true
		return errTxEnded
	case pg.TxStatus() != 'T':
		return idemstore.ErrTxAborted
	}
	sctx, cancel := h.detached(ctx)
	defer cancel()
	return h.txConn.QueryRow(sctx, query).Scan(dest...)
}

// errSyncBusy is Sync's answer on a connection that is still reading the
// rows of the handler's last query.
var errSyncBusy = errors.New("the transaction's connection is busy: close the rows of the handler's query first")

// hasMarker reports whether err is the 22P02 one of the store's statements
// raises on purpose, carrying marker.
func hasMarker(err error, marker string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, marker)
}

// Rollback implements idemstore.Tx. It is a no-op once the transaction is
// finished (after Settle, or a previous Rollback). It runs on a context
// detached from ctx's cancellation; if the ROLLBACK fails the connection is
// closed, which makes the server abort the transaction. When the
// transaction had ended behind the handle, it returns an error wrapping
// idemstore.ErrTxEnded and a later Release of the lease changes nothing.
func (t *storeTx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil {
		return nil
	}
	f := t.h.close()
	if t.conn = t.h.pool; t.conn == nil {
		return nil // the connection broke and was not replaced: nothing is open
	}
	ended, err := t.abandon(ctx, f)
	if ended {
		return fmt.Errorf("idempgx: rollback: %w", errTxEnded)
	}
	return wrap("rollback", err)
}

// abandon rolls back whatever transaction the connection has open, finds
// out whether the transaction BeginTx began ended behind the handle, and
// returns the connection to the pool (which destroys it unless idle). An
// ended transaction's lease is remembered, so that Release leaves the
// claim in progress. Callers hold t.mu.
//
// Unless rawConn handed out the raw connection (the API has no route to
// it; the tests take it to end the transaction behind the handle), only
// statements the handle filtered ran, so an open transaction is BeginTx's.
// With it, an open transaction is asked for the marker: in the same round
// trip as the ROLLBACK when it is not aborted, after a ROLLBACK TO the
// savepoint rawConn set when it is; without that savepoint an aborted
// transaction cannot be told apart from another one and counts as ended.
func (t *storeTx) abandon(ctx context.Context, f handleState) (ended bool, err error) {
	conn := t.conn
	t.conn = nil
	rctx, cancel := t.store.detached(ctx)
	defer cancel()
	pg := conn.Conn().PgConn()
	ended = f.ended
	realClosed := false // pgx's transaction knows it is over
	switch status := pg.TxStatus(); {
	case pg.IsClosed():
		// The server rolls back what the connection had open when it
		// goes; whether that was BeginTx's transaction is known only if
		// no raw statement could have ended it.
		ended = ended || f.raw
		err = errConnClosed
	case pg.IsBusy():
		// A statement is still in flight (rows the handler left open):
		// closing the connection below aborts whatever it is in.
		ended = ended || f.raw
		err = errConnBusy
	case status == 'I' && !f.begun:
		// Nothing began: there is nothing to roll back.
	case status == 'I':
		// A transaction began and nothing the handle let through ends
		// one: it ended behind the handle.
		ended = true
	case ended || !f.raw:
		err = t.h.real.Rollback(rctx)
		realClosed = true
	case status == 'T':
		var same bool
		same, err = t.sameTx(rctx, pg, "")
		ended = !same
	case f.rawSavepoint:
		var same bool
		same, err = t.sameTx(rctx, pg, "ROLLBACK TO SAVEPOINT "+rawSavepoint+"; ")
		ended = !same
	default:
		ended = true
	}
	if !pg.IsClosed() && !pg.IsBusy() && pg.TxStatus() != 'I' {
		err = errors.Join(err, pg.Exec(rctx, "ROLLBACK").Close())
	}
	if f.loUsed && !realClosed && !pg.IsClosed() && !pg.IsBusy() {
		// Large objects the handler holds answer pgx.ErrTxClosed from now
		// on, instead of running on a connection another request gets.
		_ = t.h.real.Rollback(rctx)
	}
	if err != nil || pg.TxStatus() != 'I' {
		// Leave no doubt about the transaction: close the connection.
		_ = conn.Conn().Close(rctx)
	}
	conn.Release()
	if ended {
		t.store.ended.add(t.lease)
	}
	return ended, err
}

// sameTx runs prefix, reads the marker and rolls back, in one round trip,
// and reports whether the marker is the one BeginTx set.
func (t *storeTx) sameTx(ctx context.Context, pg *pgconn.PgConn, prefix string) (bool, error) {
	res, err := pg.Exec(ctx, prefix+"SELECT pg_catalog.current_setting('"+pgsql.LeaseSetting+"', true); ROLLBACK").ReadAll()
	if err != nil {
		if prefix != "" && sqlState(err) == "3B001" { // no such savepoint: another transaction
			return false, nil
		}
		return false, err
	}
	for _, r := range res {
		if len(r.Rows) == 1 && len(r.Rows[0]) == 1 {
			return string(r.Rows[0][0]) == t.marker, nil
		}
	}
	return false, nil
}

// handleState is what the store needs to know about the handle once it has
// closed it.
type handleState struct {
	begun        bool // BEGIN went out (or the connection broke under it)
	refused      bool // a statement that would end the transaction was refused
	ended        bool // the handle saw the transaction end behind it
	raw          bool // rawConn handed out the raw connection
	rawSavepoint bool // … after setting rawSavepoint
	loUsed       bool // a savepoint handed out pgx's transaction's large objects
}

// Handle is the handler's way into the transaction the store owns. It has
// no Commit, Rollback or Conn, on purpose: the store commits the
// transaction together with the stored outcome after the handler returns,
// or rolls it back. The transaction begins with the handler's first
// statement: an Exec with arguments, a Query or a QueryRow goes out behind
// BEGIN in one batch, and behaves as it would in a pgx.Tx begun
// beforehand (a statement that fails, even before BEGIN ran, leaves the
// transaction aborted; an argument pgx cannot encode aborts nothing). To
// roll the handler's work back, return an error (or a 5xx response); for
// nested work, Begin opens a savepoint, a pgx.Tx whose Commit releases it
// and whose Rollback rolls back to it.
//
// Its methods are those of the DBTX interface sqlc generates for pgx/v5
// (river's queries run on the same shape), plus Begin: code generated by
// sqlc takes it, as do pgx.BeginFunc and libraries that query through a
// small interface (scany's pgxscan). Code that wants a pgx.Tx gets a
// savepoint from Begin.
//
//   - Transaction-control statements (COMMIT, END, ROLLBACK except
//     ROLLBACK TO SAVEPOINT, ABORT, BEGIN, START TRANSACTION, PREPARE
//     TRANSACTION, COMMIT/ROLLBACK PREPARED, … AND CHAIN) sent through
//     Exec, Query, QueryRow or SendBatch, of the handle or of a savepoint
//     (and a savepoint's Prepare), are refused with idemstore.ErrTxOwned before they
//     reach the server, also inside multi-statement strings, and the
//     refusal aborts the transaction as a failed statement does.
//   - A statement that fails on the server aborts the transaction, as in
//     PostgreSQL: later statements fail until a savepoint is rolled back
//     to, and a settle stores nothing.
//   - Nothing hands out the connection: the Rows that Query and a batch's
//     Query return, and a savepoint, answer nil from Conn (pgx.Tx and
//     pgx.Rows require the method).
//   - Once the store has finished the transaction, every method returns
//     pgx.ErrTxClosed, and so do the savepoints and the large objects a
//     savepoint handed out: do not keep them past the handler.
//
// A pgx.QueryRewriter argument (pgx.NamedArgs, …) is given the
// connection, as pgx's interface says, to rewrite the statement; the
// handle filters the rewritten text. A transaction ended behind the handle
// all the same (on that connection, or by a statement the filter does not
// know) is detected where it can be: by the connection's status, idle
// after a COMMIT or ROLLBACK, and at the settle by a marker BeginTx sets,
// which another transaction does not have. Every later statement then
// fails with an error wrapping idemstore.ErrTxEnded, and the engine keeps the
// claim in progress, marked uncertain, for Config.Reconcile or an
// operator, since what was committed stays committed. The README names
// the ends that cannot be seen.
//
// Its methods are serialised with each other and with the store's Settle
// and Rollback.
type Handle struct {
	real   pgx.Tx        // pgx's transaction, once begun
	pool   *pgxpool.Conn // the transaction's connection
	txConn *pgx.Conn     // pool's
	setup  string        // what follows BEGIN on txConn (Store.beginSetup)
	owner  *storeTx

	mu         sync.Mutex
	closed     bool // the store finished the transaction
	used       bool
	savepoints int // savepoints created, for their names
	state      handleState
}

// close marks the handle finished and returns its state. The handle's
// connection no longer changes.
func (h *Handle) close() handleState {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.state
}

// enter checks, with h.mu held, that a statement may go out: the store has
// not finished the transaction, and it has not ended behind the handle
// (it began, and the connection is idle).
func (h *Handle) enter() error {
	if h.closed {
		return pgx.ErrTxClosed
	}
	h.used = true
	if h.state.ended || h.state.begun && h.idle() {
		h.state.ended = true
		return errTxEnded
	}
	return nil
}

// leave records, with h.mu held, whether the statement that just ran left
// the connection idle: the transaction ended, and it reports so.
func (h *Handle) leave() bool {
	if !h.state.ended && h.state.begun && h.idle() {
		h.state.ended = true
	}
	return h.state.ended
}

// idle reports whether the connection is open and outside a transaction.
// A closed connection's last status says nothing: what it had open, the
// server rolls back.
func (h *Handle) idle() bool {
	pg := h.txConn.PgConn()
	return !pg.IsClosed() && pg.TxStatus() == 'I'
}

// begin begins the transaction in a round trip of its own, with h.mu
// held, unless it has begun: for the calls that cannot carry BEGIN with
// them (CopyFrom, SendBatch, savepoints, Sync, a refusal, a statement with
// pgx options or a QueryRewriter that may use the connection). It runs on
// a context detached from ctx's cancellation, bounded by WithTxTimeout.
func (h *Handle) begin(ctx context.Context) error {
	if h.state.begun {
		return nil
	}
	bctx, cancel := h.detached(ctx)
	defer cancel()
	br, err := h.first(bctx, "", nil, false)
	if err == nil {
		err = br.Close()
	}
	return err
}

// first sends BEGIN and the transaction's setup, and with stmt the
// handler's first statement, sql with args, in one batch (one round trip),
// with h.mu held, and returns the results with BEGIN's and the setup's
// read: the statement's, if any, are next. What the server did decides
// what follows a failure:
//
//   - the connection broke while ctx is live: nothing can have committed
//     (no COMMIT was sent), so the batch goes again on another connection
//     from the pool, at most maxConnRetries times;
//   - BEGIN or the setup met a prepared statement gone stale (a handler's
//     DEALLOCATE ALL on this connection in an earlier request): rolled
//     back if BEGIN ran, and sent again, as often;
//   - BEGIN ran (or the connection is gone): the transaction is the
//     store's, aborted as the failed statement left it;
//   - the server refused the batch before BEGIN ran (pgx prepares a
//     batch's new statements first, so a statement that does not parse
//     fails them all): the transaction is begun and aborted, as the
//     failed statement would have left it, so that the handler's next
//     statement cannot commit on its own;
//   - nothing reached the server (an argument pgx cannot encode): nothing
//     began, and nothing is aborted, as with a pgx.Tx.
func (h *Handle) first(ctx context.Context, sql string, args []any, stmt bool) (pgx.BatchResults, error) {
	for tries := 0; ; tries++ {
		b := newBatch()
		b.BeginTx(txOptions)
		b.queue(h.setup, h.owner.marker)
		if stmt {
			b.queue(sql, args...)
		}
		br := h.txConn.SendBatch(ctx, &b.Batch)
		_, err := br.Exec()
		if err == nil {
			if _, err = br.Exec(); err == nil {
				h.real, h.state.begun = br.Tx(), true
				return br, nil
			}
		}
		_ = br.Close()
		pg := h.txConn.PgConn()
		switch {
		case tries < maxConnRetries && pg.IsClosed() && connLost(ctx, err):
			if rerr := h.reconnect(ctx); rerr != nil {
				h.real, h.state.begun = br.Tx(), true
				return nil, err
			}
		case tries < maxConnRetries && stale(err) && !pg.IsClosed():
			if h.owner.store.rollbackOpen(ctx, pg) != nil {
				h.real, h.state.begun = br.Tx(), true
				return nil, err
			}
		case pg.IsClosed() && !isServerError(err) && ctx.Err() == nil:
			// pgx gave up on the batch and closed the connection before
			// the server had all of it (an argument it cannot encode):
			// nothing began, and the server rolls back what it got.
			if h.reconnect(ctx) != nil {
				h.real, h.state.begun = br.Tx(), true
			}
			return nil, err
		case pg.IsClosed() || pg.TxStatus() != 'I':
			h.real, h.state.begun = br.Tx(), true
			return nil, err
		case stmt && isServerError(err):
			h.abort(ctx)
			return nil, err
		default:
			return nil, err
		}
	}
}

// started records, once the handle is closed, that the settle began the
// transaction tx; it returns true.
func (h *Handle) started(tx pgx.Tx) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.real, h.state.begun = tx, true
	return true
}

// reconnect replaces the handle's broken connection, before anything
// began on it, with another from the pool, with h.mu held. The broken one
// goes back first (the pool destroys it), so that a full pool has room for
// the replacement; if none comes, the handle is left without a pool
// connection (pool nil, txConn the closed one), which the store's Settle
// and Rollback read as a transaction that ended with nothing committed.
func (h *Handle) reconnect(ctx context.Context) error {
	s := h.owner.store
	h.pool.Release()
	h.pool = nil
	actx, cancel := context.WithTimeout(ctx, s.txTimeout)
	defer cancel()
	c, err := s.pool.Acquire(actx)
	if err != nil {
		return err
	}
	h.pool, h.txConn, h.setup = c, c.Conn(), s.beginSetup(c)
	return nil
}

// isServerError reports whether err is the server's answer to a statement.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// carries reports whether a statement, sql with args as rewrite left
// them, can go out behind BEGIN in one batch as it would on its own: pgx
// sends an Exec without arguments, and a Query of no text, under the
// simple protocol (which takes several statements in one text), and a
// batch takes no pgx options (QueryExecMode, result formats) among the
// arguments.
func carries(exec bool, sql string, args []any) bool {
	if len(args) == 0 {
		return !exec && sql != ""
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// beginFor begins the transaction, with h.mu held, before a statement
// whose arguments hold a QueryRewriter other than pgx's named arguments:
// it is given the connection, and what it runs there runs in the
// transaction.
func (h *Handle) beginFor(ctx context.Context, args []any) error {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			continue
		case pgx.NamedArgs, pgx.StrictNamedArgs:
			return nil
		case pgx.QueryRewriter:
			return h.begin(ctx)
		}
		return nil
	}
	return nil
}

// detached is Store.detached, for the handle's connection.
func (h *Handle) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return h.owner.store.detached(ctx)
}

// refuse refuses a statement, with h.mu held: the transaction is aborted
// on the server as if the statement had failed there (or, if that cannot
// be done, the connection is closed, which aborts it too), and the error
// wraps idemstore.ErrTxOwned.
func (h *Handle) refuse(ctx context.Context, what string) error {
	h.state.refused = true
	h.abort(ctx)
	return fmt.Errorf("idempgx: %w: %q refused: it would end the transaction; the transaction is now aborted", idemstore.ErrTxOwned, what)
}

// abort makes the server abort the open transaction, with h.mu held,
// beginning it first if it has not begun; when that fails the connection
// is closed, which leaves nothing to commit.
func (h *Handle) abort(ctx context.Context) {
	if err := h.begin(ctx); err != nil {
		h.state.begun = true
		actx, cancel := h.detached(ctx)
		_ = h.txConn.Close(actx)
		cancel()
		return
	}
	if h.txConn.PgConn().TxStatus() != 'T' {
		return // already aborted, or ended (which enter reports)
	}
	actx, cancel := h.detached(ctx)
	defer cancel()
	_, _ = h.txConn.Exec(actx, abortSQL)
	if pg := h.txConn.PgConn(); pg.TxStatus() != 'E' && !pg.IsClosed() {
		_ = h.txConn.Close(actx)
	}
}

// Begin opens a savepoint inside the store's transaction and returns it as
// a pgx.Tx: its Commit releases the savepoint, its Rollback rolls back to
// it, and its statements are filtered like the handle's. So
// pgx.BeginFunc(ctx, h, fn) runs fn in a savepoint, and an error from fn
// undoes fn's work only. The savepoint is closed, like the handle, once
// the store has finished the transaction.
func (h *Handle) Begin(ctx context.Context) (pgx.Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return nil, err
	}
	if err := h.begin(ctx); err != nil {
		return nil, err
	}
	h.savepoints++
	name := "idem_sp_" + strconv.Itoa(h.savepoints)
	_, err := h.real.Exec(ctx, "savepoint "+name)
	if h.leave() && err == nil {
		err = errTxEnded
	}
	if err != nil {
		return nil, err
	}
	return &savepoint{root: h, name: name}, nil
}

// CopyFrom runs COPY FROM STDIN in the transaction, as pgx.Tx does.
func (h *Handle) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return 0, err
	}
	if err := h.begin(ctx); err != nil {
		return 0, err
	}
	n, err := h.real.CopyFrom(ctx, tableName, columnNames, rowSrc)
	if h.leave() && err == nil {
		err = errTxEnded
	}
	return n, err
}

// SendBatch sends b in the transaction, as pgx.Tx does, after rewriting
// each query as pgx would (QueryRewriter arguments) and refusing the whole
// batch, before anything is sent, if any query holds a
// transaction-control statement. A batch that begins its own transaction
// (Batch.BeginTx) is refused the same way.
func (h *Handle) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := h.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	texts := make([]string, 0, len(b.QueuedQueries))
	for _, q := range b.QueuedQueries {
		var rw pgx.QueryRewriter
		args := q.Arguments
		for len(args) > 0 {
			r, ok := args[0].(pgx.QueryRewriter)
			if !ok {
				break
			}
			rw, args = r, args[1:]
		}
		if rw != nil {
			sql, rargs, err := rw.RewriteQuery(ctx, h.txConn, q.SQL, args)
			if err != nil {
				return pgx.FailedBatchResults(b, fmt.Errorf("rewrite query failed: %w", err))
			}
			q.SQL, q.Arguments = sql, rargs
		}
		texts = append(texts, q.SQL)
	}
	// Each query is one statement on the wire, except under the simple
	// protocol, where pgx joins them with "\n;" into one text.
	for _, sql := range append(texts, strings.Join(texts, "\n;")) {
		if words, bad := txControl(sql); bad {
			return pgx.FailedBatchResults(b, h.refuse(ctx, words))
		}
	}
	return batchResults{h.real.SendBatch(ctx, b)}
}

// savepointLargeObjects returns the large objects of pgx's own transaction, the one
// BeginTx began, for a savepoint's LargeObjects; it never fails or panics.
// Once the store has finished the transaction (or it ended behind the
// handle) their methods return pgx.ErrTxClosed.
func (h *Handle) savepointLargeObjects() pgx.LargeObjects {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.state.ended {
		return closedTx.LargeObjects()
	}
	if err := h.begin(context.Background()); err != nil {
		return closedTx.LargeObjects()
	}
	h.used, h.state.loUsed = true, true
	return h.real.LargeObjects()
}

// closedTx is a closed pgx.Tx with no connection: every method returns
// pgx.ErrTxClosed without any I/O. pgx makes one for a batch that began a
// transaction and failed before sending anything.
var closedTx = func() pgx.Tx {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(&b, pgx.ErrTxClosed).Tx()
}()

// txControl reports whether sql holds a statement that would begin, end
// or prepare a transaction under either setting of
// standard_conforming_strings (a handler can change it with SET), with
// that statement's first words for the error.
func txControl(sql string) (string, bool) { return sqlguard.TxControl(sqlguard.PostgreSQL, sql) }

// prepareFiltered prepares sql on the connection, for a savepoint's Prepare, as
// pgx.Tx does, after refusing a transaction-control statement.
func (h *Handle) prepareFiltered(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return nil, err
	}
	if words, bad := txControl(sql); bad {
		return nil, h.refuse(ctx, words)
	}
	if err := h.begin(ctx); err != nil {
		return nil, err
	}
	sd, err := h.real.Prepare(ctx, name, sql)
	if h.leave() && err == nil {
		err = errTxEnded
	}
	return sd, err
}

// Exec runs sql in the transaction, as pgx.Tx does, after refusing a
// transaction-control statement anywhere in it.
func (h *Handle) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := h.beginFor(ctx, args); err != nil {
		return pgconn.CommandTag{}, err
	}
	sql, args, err := rewrite(ctx, h.txConn, sql, args, false)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if words, bad := txControl(sql); bad {
		return pgconn.CommandTag{}, h.refuse(ctx, words)
	}
	var tag pgconn.CommandTag
	if h.state.begun || !carries(true, sql, args) {
		if err = h.begin(ctx); err == nil {
			tag, err = h.real.Exec(ctx, sql, args...)
		}
	} else if br, ferr := h.first(ctx, sql, args, true); ferr != nil {
		err = ferr
	} else {
		tag, err = br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if h.leave() && err == nil {
		err = errTxEnded
	}
	return tag, err
}

// Query runs sql in the transaction, as pgx.Tx does, after refusing a
// transaction-control statement anywhere in it. The rows are pgx's own,
// except that their Conn returns nil.
func (h *Handle) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return errRows{err, h.txConn.TypeMap()}, err
	}
	if err := h.beginFor(ctx, args); err != nil {
		return errRows{err, h.txConn.TypeMap()}, err
	}
	sql, args, err := rewrite(ctx, h.txConn, sql, args, true)
	if err != nil {
		return errRows{err, h.txConn.TypeMap()}, err
	}
	if words, bad := txControl(sql); bad {
		err := h.refuse(ctx, words)
		return errRows{err, h.txConn.TypeMap()}, err
	}
	if h.state.begun || !carries(false, sql, args) {
		if err := h.begin(ctx); err != nil {
			return errRows{err, h.txConn.TypeMap()}, err
		}
		r, err := h.real.Query(ctx, sql, args...)
		return rows{r}, err
	}
	br, err := h.first(ctx, sql, args, true)
	if err != nil {
		return errRows{err, h.txConn.TypeMap()}, err
	}
	r, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows{r}, err
	}
	return &firstRows{rows: rows{r}, br: br}, nil
}

// QueryRow runs sql in the transaction, as pgx.Tx does, after refusing a
// transaction-control statement anywhere in it.
func (h *Handle) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.enter(); err != nil {
		return errRow{err}
	}
	if err := h.beginFor(ctx, args); err != nil {
		return errRow{err}
	}
	sql, args, err := rewrite(ctx, h.txConn, sql, args, true)
	if err != nil {
		return errRow{err}
	}
	if words, bad := txControl(sql); bad {
		return errRow{h.refuse(ctx, words)}
	}
	if h.state.begun || !carries(false, sql, args) {
		if err := h.begin(ctx); err != nil {
			return errRow{err}
		}
		return h.real.QueryRow(ctx, sql, args...)
	}
	br, err := h.first(ctx, sql, args, true)
	if err != nil {
		return errRow{err}
	}
	return firstRow{br.QueryRow(), br}
}

// rawConn returns the transaction's connection, unfiltered. No method of
// the handle or its savepoints hands it out; the tests take it (through
// export_test.go) to end the transaction behind the handle and prove that
// the store detects it. The first call sets a savepoint (one round trip)
// by which the store can later tell an aborted transaction from another
// one.
func (h *Handle) rawConn() *pgx.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return h.txConn
	}
	h.used = true
	if !h.state.raw {
		h.state.raw = true
		if h.begin(context.Background()) == nil && h.txConn.PgConn().TxStatus() == 'T' {
			ctx, cancel := h.detached(context.Background())
			_, err := h.txConn.Exec(ctx, "SAVEPOINT "+rawSavepoint)
			cancel()
			h.state.rawSavepoint = err == nil
		}
	}
	return h.txConn
}

// rewrite does what pgx does with a statement's leading option arguments
// before it sends it: a QueryRewriter (pgx.NamedArgs, pgx.StrictNamedArgs,
// …) rewrites sql and the arguments, so that the filter sees the text the
// server gets. Other options (pgx.QueryExecMode and, for Query,
// pgx.QueryResultFormats and pgx.QueryResultFormatsByOID) stay in front of
// the rewritten arguments for pgx.
func rewrite(ctx context.Context, conn *pgx.Conn, sql string, args []any, formats bool) (string, []any, error) {
	var (
		opts []any
		rw   pgx.QueryRewriter
		i    int
	)
options:
	for ; i < len(args); i++ {
		switch a := args[i].(type) {
		case pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			if !formats {
				break options
			}
			opts = append(opts, a)
		case pgx.QueryExecMode:
			opts = append(opts, a)
		case pgx.QueryRewriter:
			rw = a
		default:
			break options
		}
	}
	if rw == nil {
		return sql, args, nil
	}
	sql, rest, err := rw.RewriteQuery(ctx, conn, sql, args[i:])
	if err != nil {
		return "", nil, fmt.Errorf("rewrite query failed: %w", err)
	}
	return sql, append(opts, rest...), nil
}

// savepoint is a savepoint inside a handle, the pgx.Tx that Begin
// returns: Commit releases it and Rollback rolls back to it, as pgx's
// savepoints do, and every statement goes through the handle's filter.
// Once it is released or rolled back, or the store has finished the
// transaction, its methods return pgx.ErrTxClosed.
type savepoint struct {
	root   *Handle
	name   string
	mu     sync.Mutex
	closed bool
}

func (s *savepoint) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return pgx.ErrTxClosed
	}
	return nil
}

// end releases the savepoint or rolls back to it, and closes it either way.
func (s *savepoint) end(ctx context.Context, sql string) error {
	if err := s.open(); err != nil {
		return err
	}
	h := s.root
	h.mu.Lock()
	err := h.enter()
	if err == nil {
		_, err = h.real.Exec(ctx, sql+s.name)
		if h.leave() && err == nil {
			err = errTxEnded
		}
	}
	h.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return err
}

// Begin opens a savepoint nested in this one.
func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.Begin(ctx)
}

// Commit releases the savepoint.
func (s *savepoint) Commit(ctx context.Context) error { return s.end(ctx, "release savepoint ") }

// Rollback rolls back to the savepoint and releases it.
func (s *savepoint) Rollback(ctx context.Context) error {
	return s.end(ctx, "rollback to savepoint ")
}

// CopyFrom is the handle's CopyFrom.
func (s *savepoint) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	return s.root.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// SendBatch is the handle's SendBatch.
func (s *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := s.open(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return s.root.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of pgx's own transaction, the one
// BeginTx began; it never fails or panics. Once the store has finished the
// transaction (or it ended behind the handle) their methods return
// pgx.ErrTxClosed.
func (s *savepoint) LargeObjects() pgx.LargeObjects {
	if err := s.open(); err != nil {
		return closedTx.LargeObjects()
	}
	return s.root.savepointLargeObjects()
}

// Prepare prepares sql on the connection, as pgx.Tx does, after refusing
// a transaction-control statement.
func (s *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.prepareFiltered(ctx, name, sql)
}

// Exec is the handle's Exec.
func (s *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.open(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.root.Exec(ctx, sql, args...)
}

// Query is the handle's Query.
func (s *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.open(); err != nil {
		return errRows{err, s.root.txConn.TypeMap()}, err
	}
	return s.root.Query(ctx, sql, args...)
}

// QueryRow is the handle's QueryRow.
func (s *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.open(); err != nil {
		return errRow{err}
	}
	return s.root.QueryRow(ctx, sql, args...)
}

// Conn returns nil. pgx.Tx requires the method, but the connection is the
// store's: what runs on it escapes the handle's filter, and a COMMIT there
// would commit the handler's writes whether or not the outcome can be
// stored. A caller that uses the nil connection panics, in the handler,
// before anything reaches the server.
func (s *savepoint) Conn() *pgx.Conn { return nil }

// rows are pgx's rows of a query run through the handle, without their
// connection.
type rows struct{ pgx.Rows }

// Conn returns nil: the connection is the store's (see savepoint.Conn).
func (rows) Conn() *pgx.Conn { return nil }

// firstRows are the rows of the handler's first statement, which went out
// behind BEGIN in one batch: once they are closed, by Close or by Next
// reaching their end as pgx's rows are, the batch is closed too, and the
// connection is free for the next statement.
type firstRows struct {
	rows
	br pgx.BatchResults
}

func (r *firstRows) Next() bool {
	if r.rows.Next() {
		return true
	}
	_ = r.br.Close()
	return false
}

func (r *firstRows) Close() {
	r.rows.Close()
	_ = r.br.Close()
}

// firstRow is the row of the handler's first statement, which went out
// behind BEGIN in one batch: Scan closes the batch.
type firstRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r firstRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batchResults are pgx's results of a batch sent through the handle, whose
// queries' rows come without their connection.
type batchResults struct{ pgx.BatchResults }

// Query returns the next query's rows.
func (b batchResults) Query() (pgx.Rows, error) {
	r, err := b.BatchResults.Query()
	return rows{r}, err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows are the rows of a statement refused before it was sent.
type errRows struct {
	err error
	tm  *pgtype.Map
}

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return r.tm }

var (
	_ pgx.Tx           = (*savepoint)(nil)
	_ pgx.Rows         = rows{}
	_ pgx.Rows         = errRows{}
	_ idemstore.Tx     = (*storeTx)(nil)
	_ idemstore.Syncer = (*storeTx)(nil)
)
