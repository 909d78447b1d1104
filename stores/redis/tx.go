package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

type txKey struct{}

// NoTx is what Tx hands the handler, and its name is the point: there is
// no database transaction. Redis holds the idempotency record; the
// handler's business writes go to its own database, and they commit when
// the handler commits them, whether or not the outcome is stored
// afterwards. A crash, a lost lease or a lost Redis record between the two
// leaves the business write without its stored outcome, and the key is run
// again (by a retry or a takeover).
//
// So the handler makes its business write idempotent itself: it derives
// the write's unique key with idem.DownstreamKey(ctx, step), inserts it in
// a column with a unique constraint beside the request's own fields
// (INSERT … ON CONFLICT DO NOTHING), and when the row exists already
// compares it with the request: it answers the same request from the row
// instead of writing again, and another request (the key reused after Redis
// lost its record) with 422 idem.ProblemKeyReused. The package
// documentation has the failure table.
//
// NoTx has no Commit or Rollback: there is nothing to end.
type NoTx struct {
	st *storeTx
}

// Tx returns the handle BeginTx put into ctx. ok is false when ctx carries
// none (the request was not claimed, for instance when the idempotency key
// is optional and absent). Calling it is what idemstore.Tx.Used reports, and so
// idem.Event.TxUsed: a handler that answers 2xx without asking for the
// handle wrote, if anything, without knowing the store's terms.
func Tx(ctx context.Context) (*NoTx, bool) {
	ctx, _ = idem.AttemptContext(ctx)
	h, ok := ctx.Value(txKey{}).(*NoTx)
	if !ok || h == nil {
		return nil, false
	}
	h.st.used.Store(true)
	return h, true
}

// Lease returns the lease the handler's attempt holds.
func (h *NoTx) Lease() idemstore.Lease { return h.st.lease }

// Transactional reports whether the handle is a database transaction the
// handler's writes commit with. It is always false; it exists so that
// generic code can tell, and so that the trade-off shows in every call
// site that asks.
func (h *NoTx) Transactional() bool { return false }

// CheckLease asks Redis, in one round trip, whether the attempt still
// holds its lease: nil while the record is in progress under the
// attempt's token, idemstore.ErrLeaseLost once it was taken over, released,
// settled or lost (a Redis restart). A handler calls it just before
// committing its business write to narrow, not close, the window in which
// a slow attempt writes after a takeover: the unique downstream-key column
// closes it.
func (h *NoTx) CheckLease(ctx context.Context) error {
	s, l := h.st.store, h.st.lease
	v, err := s.client.HMGet(ctx, s.keysFor(l.Principal, l.Key).record, "s", "t").Result()
	if err != nil {
		return wrap("check lease", err)
	}
	if len(v) != 2 || v[0] != string(idemstore.StateInProgress) || v[1] != l.Token {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// BeginTx implements idemstore.Store. It begins nothing, so it costs no round
// trip: it puts a NoTx for lease into ctx, for Tx, and returns the idemstore.Tx
// whose Settle stores the outcome.
func (s *Store) BeginTx(ctx context.Context, lease idemstore.Lease) (context.Context, idemstore.Tx, error) {
	st := &storeTx{store: s, lease: lease}
	st.handle = &NoTx{st: st}
	return context.WithValue(ctx, txKey{}, st.handle), st, nil
}

// storeTx is the idemstore.Tx the engine drives.
type storeTx struct {
	store    *Store
	lease    idemstore.Lease
	handle   *NoTx
	used     atomic.Bool
	finished atomic.Bool
}

// errFinished is returned by a second Settle.
var errFinished = errors.New("idemredis: settle: the attempt is finished already")

// Settle implements idemstore.Tx: one script run that stores the outcome,
// fenced by the lease token and the in-progress state, and takes the
// record out of the in-progress index. A miss returns idemstore.ErrLeaseLost
// and stores nothing. There is nothing to commit: the handler's own
// writes were committed (or not) by the handler.
//
// A settle whose answer was lost is sent again by go-redis; the script
// recognises that its own token stored the outcome and reports success.
// Settle does not keep outcome's header map or body: they are encoded
// into the command before it returns.
func (t *storeTx) Settle(ctx context.Context, out idemstore.Outcome) error {
	if !t.finished.CompareAndSwap(false, true) {
		return errFinished
	}
	if out.State != idemstore.StateCompleted && out.State != idemstore.StateFailed {
		return fmt.Errorf("idemredis: settle: state %q is not a settled state", out.State)
	}
	s := t.store
	k := s.keysFor(t.lease.Principal, t.lease.Key)
	args := s.withNotify([]any{k.member, t.lease.Token,
		string(out.State), strconv.Itoa(out.Response.Status), idemstore.EncodeHeader(out.Response.Header),
		out.Response.Body}, t.lease)
	n, err := settleScript.Run(ctx, s.client, []string{k.record, k.index}, args...).Int64()
	if err != nil {
		return wrap("settle", err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Rollback implements idemstore.Tx. There is no transaction to roll back, so it
// only ends the attempt's handle: it does not undo anything the handler
// wrote. It is safe after Settle and more than once.
func (t *storeTx) Rollback(context.Context) error {
	t.finished.Store(true)
	return nil
}

// Used implements idemstore.Tx: whether the handler called Tx for the handle.
func (t *storeTx) Used() bool { return t.used.Load() }
