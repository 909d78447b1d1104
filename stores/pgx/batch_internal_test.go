package idempgx

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestBatchQueuesAsPgx: a batch holds the queries pgx.Batch.Queue would,
// in order, with their arguments copied, past its own room for queries and
// arguments too, and beside queries queued with Queue itself.
func TestBatchQueuesAsPgx(t *testing.T) {
	type q struct {
		sql  string
		args []any
	}
	var qs []q
	for i := range 7 {
		args := make([]any, i) // 0+1+…+6 = 21 arguments: past the batch's room
		for j := range args {
			args[j] = strconv.Itoa(i) + "." + strconv.Itoa(j)
		}
		qs = append(qs, q{"SELECT " + strconv.Itoa(i), args})
	}
	b, want := newBatch(), &pgx.Batch{}
	for i, q := range qs {
		if i == 2 {
			b.Queue("NOTIFY", "x") // as queueNotify does
			want.Queue("NOTIFY", "x")
		}
		b.queue(q.sql, q.args...)
		want.Queue(q.sql, q.args...)
	}
	for _, q := range qs {
		for j := range q.args {
			q.args[j] = "changed" // the batch holds copies
		}
	}
	if b.Len() != want.Len() {
		t.Fatalf("%d queries, want %d", b.Len(), want.Len())
	}
	for i, got := range b.QueuedQueries {
		w := want.QueuedQueries[i]
		if got.SQL != w.SQL || len(got.Arguments) != len(w.Arguments) {
			t.Fatalf("query %d: %q with %d arguments, want %q with %d", i, got.SQL, len(got.Arguments), w.SQL, len(w.Arguments))
		}
		for j, a := range got.Arguments {
			if a == "changed" {
				t.Errorf("query %d argument %d is the caller's, not a copy", i, j)
			}
		}
	}
	// Appending to one query's arguments must not write over the next's.
	first := b.QueuedQueries[1]
	_ = append(first.Arguments, "appended")
	if next := b.QueuedQueries[3]; !reflect.DeepEqual(next.Arguments, []any{"2.0", "2.1"}) {
		t.Errorf("query 3's arguments are %v after an append to query 1's", next.Arguments)
	}
}
