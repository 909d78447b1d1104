package idempgx

import "github.com/jackc/pgx/v5"

// batch is a pgx.Batch whose queries and their argument lists live in the
// batch itself, so that building one of the store's batches costs one
// allocation instead of one per query and per argument list (and the
// growth of the query list). Queries past its room are queued as
// pgx.Batch.Queue does.
type batch struct {
	pgx.Batch
	queries [4]pgx.QueuedQuery
	ptrs    [4]*pgx.QueuedQuery
	args    [12]any
	nargs   int
}

func newBatch() *batch {
	b := new(batch)
	b.QueuedQueries = b.ptrs[:0]
	return b
}

// queue queues sql with args, copied.
func (b *batch) queue(sql string, args ...any) {
	n := len(b.QueuedQueries)
	if n >= len(b.queries) || b.nargs+len(args) > len(b.args) {
		b.Queue(sql, append([]any(nil), args...)...)
		return
	}
	var a []any
	if len(args) > 0 {
		a = b.args[b.nargs : b.nargs+len(args) : b.nargs+len(args)]
		copy(a, args)
		b.nargs += len(args)
	}
	b.queries[n] = pgx.QueuedQuery{SQL: sql, Arguments: a}
	b.QueuedQueries = append(b.QueuedQueries, &b.queries[n])
}
