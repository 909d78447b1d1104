package idempgx

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The statements of every request (the claim's batch and the settle's)
// go to the server through pgconn when the pool prepares statements
// (pgx.QueryExecModeCacheStatement, pgx's default): prepared once per
// connection under the store's own names, bound to values the store
// encodes itself, and sent as one pgconn.Batch. The server runs what pgx
// would have sent in that mode, the same statements in the same round
// trips; what goes is pgx's work per statement in Go (its encode plans,
// pipeline bookkeeping and rows), a third of a replay's instructions and
// allocations. Other exec modes, BEGIN and the rarer calls go through
// pgx.Batch.
//
// A connection's statements are dropped and prepared again when the
// server says one is gone or changed (stale). Each preparation first
// closes the names it prepares, so whatever the session held under them
// is replaced.

// directStmt indexes Store.directSQL and prepared.
type directStmt int

const (
	stmtInsertPrelude directStmt = iota
	stmtDurableInsertPrelude
	stmtClaim
	stmtClaimRead
	stmtSettleCheck
	stmtSettle
	stmtCommit
	numDirect
)

// prepared is the statements of Store.directSQL as one connection has
// them, kept in its pgconn.PgConn.CustomData under Store.preparedKey, and
// the formats their results are asked in: text columns as text, which
// the server sends as they are, everything else binary.
type prepared struct {
	sd      [numDirect]*pgconn.StatementDescription
	formats [numDirect][]int16
}

// initDirect sets the statements the store prepares and their names.
func (s *Store) initDirect(mode pgx.QueryExecMode) {
	s.direct = mode == pgx.QueryExecModeCacheStatement
	s.tracer, _ = s.pool.Config().ConnConfig.Tracer.(pgx.BatchTracer)
	s.directSQL = [numDirect]string{
		stmtInsertPrelude:        s.sql.InsertPrelude,
		stmtDurableInsertPrelude: s.sql.DurableInsertPrelude,
		stmtClaim:                s.sql.Claim,
		stmtClaimRead:            s.sql.ClaimRead,
		stmtSettleCheck:          s.sql.SettleCheck,
		stmtSettle:               s.sql.Settle,
		stmtCommit:               "COMMIT",
	}
	h := sha256.New()
	for i, q := range s.directSQL {
		sum := sha256.Sum256([]byte(q))
		s.directNames[i] = "idempgx_" + hex.EncodeToString(sum[:8])
		h.Write(sum[:])
	}
	s.preparedKey = "idempgx.prepared." + hex.EncodeToString(h.Sum(nil)[:8])
}

// prepared returns the connection's statements, preparing them (one round
// trip) when it has none.
func (s *Store) prepared(ctx context.Context, pg *pgconn.PgConn) (*prepared, error) {
	if p, ok := pg.CustomData()[s.preparedKey].(*prepared); ok {
		return p, nil
	}
	pl := pg.StartPipeline(ctx)
	for i, q := range s.directSQL {
		pl.SendDeallocate(s.directNames[i])
		pl.SendPrepare(s.directNames[i], q, nil)
	}
	p, err := func() (*prepared, error) {
		if err := pl.Sync(); err != nil {
			return nil, err
		}
		p := new(prepared)
		for i := range s.directSQL {
			if _, err := pl.GetResults(); err != nil {
				return nil, err
			}
			r, err := pl.GetResults()
			if err != nil {
				return nil, err
			}
			sd, ok := r.(*pgconn.StatementDescription)
			if !ok {
				return nil, fmt.Errorf("prepare: got %T, want a statement description", r)
			}
			sd.Name, sd.SQL = s.directNames[i], s.directSQL[i]
			p.sd[i], p.formats[i] = sd, resultFormats(sd.Fields)
		}
		if _, err := pl.GetResults(); err != nil {
			return nil, err
		}
		return p, nil
	}()
	if cerr := pl.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("prepare the store's statements: %w", err)
	}
	pg.CustomData()[s.preparedKey] = p
	return p, nil
}

// forget drops the connection's statements when err says one of them is
// gone or no longer fits, so that the next use prepares them again.
func (s *Store) forget(pg *pgconn.PgConn, err error) {
	if stale(err) {
		delete(pg.CustomData(), s.preparedKey)
	}
}

// arg is one value a directBatch binds: text, bytes or an integer,
// encoded for the type the server gave the parameter.
type arg struct {
	kind byte // 't' text, 'b' bytes, 'i' integer
	str  string
	byt  []byte
	num  int64
}

func textArg(s string) arg  { return arg{kind: 't', str: s} }
func bytesArg(b []byte) arg { return arg{kind: 'b', byt: b} }
func intArg(n int64) arg    { return arg{kind: 'i', num: n} }

// value is a as pgx would have been given it, for a tracer.
func (a arg) value() any {
	switch a.kind {
	case 't':
		return a.str
	case 'b':
		return a.byt
	}
	return a.num
}

// encode appends a in binary format for a parameter of type oid: text
// and bytea as their bytes, integers big-endian, anything else through
// the connection's type map.
func (a arg) encode(m *pgtype.Map, oid uint32, buf []byte) ([]byte, error) {
	switch {
	case a.kind == 't' && (oid == pgtype.TextOID || oid == pgtype.VarcharOID):
		return append(buf, a.str...), nil
	case a.kind == 'b' && oid == pgtype.ByteaOID:
		return append(buf, a.byt...), nil
	case a.kind == 'i' && oid == pgtype.Int8OID:
		return binary.BigEndian.AppendUint64(buf, uint64(a.num)), nil
	case a.kind == 'i' && oid == pgtype.Int4OID && a.num == int64(int32(a.num)):
		return binary.BigEndian.AppendUint32(buf, uint32(a.num)), nil
	}
	return m.Encode(oid, pgtype.BinaryFormatCode, a.value(), buf)
}

// directBatch is a batch of the connection's prepared statements, sent
// with pgconn's ExecBatch: one round trip, one implicit transaction
// outside a transaction block.
type directBatch struct {
	conn   *pgx.Conn
	tracer pgx.BatchTracer
	b      pgconn.Batch
	buf    []byte // every parameter's bytes

	n       int
	stmts   [4]*pgconn.StatementDescription
	formats [4][]int16 // of the results
	params  [4][][]byte
	vals    [16][]byte
	nvals   int
	err     error

	traced pgx.Batch // what a tracer is told: what pgx would have told it
}

// directBatch returns an empty batch on conn, with room for size bytes of
// parameters.
func (s *Store) directBatch(conn *pgx.Conn, size int) *directBatch {
	return &directBatch{conn: conn, tracer: s.tracer, buf: make([]byte, 0, size)}
}

var binaryParam = [8]int16{1, 1, 1, 1, 1, 1, 1, 1}

// resultFormats returns the result formats for fields: text for text
// columns, binary for the others.
func resultFormats(fields []pgconn.FieldDescription) []int16 {
	f := make([]int16, len(fields))
	for i, fd := range fields {
		if fd.DataTypeOID != pgtype.TextOID && fd.DataTypeOID != pgtype.VarcharOID {
			f[i] = pgtype.BinaryFormatCode
		}
	}
	return f
}

// queue adds the statement p holds at i, bound to args, to the batch.
func (d *directBatch) queue(p *prepared, i directStmt, args ...arg) {
	sd := p.sd[i]
	if d.err != nil {
		return
	}
	if len(args) != len(sd.ParamOIDs) || d.nvals+len(args) > len(d.vals) || d.n == len(d.stmts) {
		d.err = fmt.Errorf("statement %s: %d arguments for %d parameters", sd.Name, len(args), len(sd.ParamOIDs))
		return
	}
	params := d.vals[d.nvals : d.nvals+len(args) : d.nvals+len(args)]
	for i, a := range args {
		start := len(d.buf)
		if d.buf, d.err = a.encode(d.conn.TypeMap(), sd.ParamOIDs[i], d.buf); d.err != nil {
			return
		}
		params[i] = d.buf[start:len(d.buf):len(d.buf)]
	}
	d.nvals += len(args)
	d.stmts[d.n], d.formats[d.n], d.params[d.n] = sd, p.formats[i], params
	d.n++
	if d.tracer != nil {
		vals := make([]any, len(args))
		for j, a := range args {
			vals[j] = a.value()
		}
		d.traced.Queue(sd.SQL, vals...)
	}
}

// send sends the batch and reads its results in order. row, if not nil, is
// called with the values of the first row of the statement at index rowAt.
// It returns the command tags of the statements that completed, how many
// completed, and the first error (the statement at index done failed, or
// the batch could not be sent or read).
func (d *directBatch) send(ctx context.Context, rowAt int, row func([]pgconn.FieldDescription, [][]byte) error) (tags [4]pgconn.CommandTag, done int, err error) {
	if d.err != nil {
		return tags, 0, d.err
	}
	for i := 0; i < d.n; i++ {
		var formats []int16
		if len(d.params[i]) > 0 {
			formats = binaryParam[:len(d.params[i])]
		}
		d.b.ExecStatement(d.stmts[i], d.params[i], formats, d.formats[i])
	}
	tracer := d.tracer
	if tracer != nil {
		ctx = tracer.TraceBatchStart(ctx, d.conn, pgx.TraceBatchStartData{Batch: &d.traced})
	}
	trace := func(i int, tag pgconn.CommandTag, err error) {
		q := d.traced.QueuedQueries[i]
		tracer.TraceBatchQuery(ctx, d.conn, pgx.TraceBatchQueryData{SQL: q.SQL, Args: q.Arguments, CommandTag: tag, Err: err})
	}
	mrr := d.conn.PgConn().ExecBatch(ctx, &d.b)
	for done < d.n && err == nil && mrr.NextResult() {
		rr := mrr.ResultReader()
		if done == rowAt && row != nil && rr.NextRow() {
			err = row(rr.FieldDescriptions(), rr.Values())
		}
		tag, cerr := rr.Close()
		if err == nil {
			err = cerr
		}
		if err == nil {
			tags[done] = tag
			if tracer != nil {
				trace(done, tag, nil)
			}
			done++
		}
	}
	if cerr := mrr.Close(); err == nil {
		err = cerr
	}
	if err == nil && done < d.n {
		err = errors.New("idempgx: the server answered fewer statements than the batch sent")
	}
	if tracer != nil {
		if err != nil && done < d.n {
			trace(done, pgconn.CommandTag{}, err)
		}
		tracer.TraceBatchEnd(ctx, d.conn, pgx.TraceBatchEndData{Err: err})
	}
	return tags, done, err
}

// claimDirect is claimOnce through pgconn, behind the prelude req.Durable
// selects (the one Claim passes claimOnce).
func (s *Store) claimDirect(ctx context.Context, req idemstore.ClaimRequest) (inserted bool, rec idem.Record, now time.Time, found bool, err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, rec, now, false, err
	}
	defer c.Release()
	conn := c.Conn()
	p, err := s.prepared(ctx, conn.PgConn())
	if err != nil {
		return false, rec, now, false, err
	}
	prelude := stmtInsertPrelude
	if req.Durable {
		prelude = stmtDurableInsertPrelude
	}
	d := s.directBatch(conn, 2*len(req.Principal)+2*len(req.Key)+len(req.Fingerprint)+len(req.Token)+
		len(req.RequestID)+len(req.Nonce)+16)
	principal, key := textArg(req.Principal), textArg(req.Key)
	d.queue(p, prelude)
	d.queue(p, stmtClaim, principal, key, bytesArg(req.Fingerprint), textArg(req.Token), textArg(req.RequestID),
		intArg(micros(req.Retention)), textArg(req.Nonce), intArg(micros(req.Lease)))
	d.queue(p, stmtClaimRead, principal, key)
	sc := recordScanner{now: &now}
	tags, _, err := d.send(ctx, 2, func(fds []pgconn.FieldDescription, vals [][]byte) error {
		found = true
		return sc.scanRaw(conn.TypeMap(), fds, vals)
	})
	if err != nil {
		s.forget(conn.PgConn(), err)
		return false, rec, now, false, err
	}
	if !found {
		return false, rec, now, false, nil
	}
	return tags[1].RowsAffected() == 1, sc.rec, now, true, nil
}

// settleDirect sends the settle's batch through pgconn: the marker check,
// the fenced UPDATE and COMMIT. It returns the error of the statement that
// failed (a batch that could not be sent or read fails at the check), or
// the COMMIT's tag.
func (t *storeTx) settleDirect(ctx context.Context, out idemstore.Outcome, headers, body []byte) (checkErr, updErr error, commitTag pgconn.CommandTag, commitErr error) {
	s, conn := t.store, t.conn.Conn()
	p, err := s.prepared(ctx, conn.PgConn())
	if err != nil {
		return err, nil, commitTag, nil
	}
	d := s.directBatch(conn, len(t.marker)+len(t.lease.Principal)+len(t.lease.Key)+len(t.lease.Token)+
		len(out.State)+8+len(headers)+len(body))
	d.queue(p, stmtSettleCheck, textArg(t.marker))
	d.queue(p, stmtSettle, textArg(t.lease.Principal), textArg(t.lease.Key), textArg(t.lease.Token),
		textArg(string(out.State)), intArg(int64(out.Response.Status)), bytesArg(headers), bytesArg(body))
	d.queue(p, stmtCommit)
	tags, done, err := d.send(ctx, -1, nil)
	if err != nil {
		s.forget(conn.PgConn(), err)
	}
	switch done {
	case 0:
		return err, nil, commitTag, nil
	case 1:
		return nil, err, commitTag, nil
	}
	return nil, nil, tags[2], err
}
