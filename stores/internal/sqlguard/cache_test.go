package sqlguard_test

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/idemgo/idem/stores/internal/sqlguard"
	"github.com/idemgo/idem/stores/internal/sqlguard/guardtest"
)

type txControlVerdict struct {
	words   string
	refused bool
}

// uncached runs TxControl and ReadAll without their caches.
func uncached(d sqlguard.Dialect, q string) (txControlVerdict, []sqlguard.Verdict) {
	words, refused := sqlguard.TxControlUncached(d, q)
	return txControlVerdict{words, refused}, sqlguard.ReadAllUncached(d, q)
}

// check fails t unless the cached answers for q are the uncached ones.
func check(t *testing.T, d sqlguard.Dialect, q string) {
	t.Helper()
	wantTC, wantVs := uncached(d, q)
	words, refused := sqlguard.TxControl(d, q)
	if got := (txControlVerdict{words, refused}); got != wantTC {
		t.Errorf("%s: sqlguard.TxControl(%.60q) = %+v, want %+v", d, q, got, wantTC)
	}
	if got := sqlguard.ReadAll(d, q); !reflect.DeepEqual(got, wantVs) {
		t.Errorf("%s: sqlguard.ReadAll(%.60q) = %+v, want %+v", d, q, got, wantVs)
	}
}

// TestCacheAnswersAsTheLexer: with the cache warm, every case and random
// text gets the verdict the lexer gives it, whatever was asked before.
func TestCacheAnswersAsTheLexer(t *testing.T) {
	for round := range 2 { // cold, then warm
		for _, c := range guardtest.Cases {
			check(t, c.Dialect, c.SQL)
		}
		for _, d := range []sqlguard.Dialect{sqlguard.PostgreSQL, sqlguard.MySQL, sqlguard.SQLite} {
			for _, q := range guardtest.Texts(d, 300, uint64(round)) {
				check(t, d, q)
			}
		}
	}
}

// TestCacheNotPoisoned: texts that differ only past what a cache could
// key on by mistake (a prefix, a length, the first statement) keep their
// own verdicts, in either order, and a caller that changes the verdicts
// it got does not change what the next caller gets.
func TestCacheNotPoisoned(t *testing.T) {
	long := "SELECT 1 /*" + strings.Repeat("x", sqlguard.CacheMaxText) + "*/; "
	short := "SELECT 1 /*" + strings.Repeat("x", sqlguard.CacheMaxText-100) + "*/; "
	for _, pair := range [][2]string{
		{long + "SELECT 2", long + "COMMIT"},                     // longer than any key kept
		{short + "SELECT 2", short + "COMMIT"},                   // kept, differing in the last bytes
		{"SELECT 1; COMMIT", "SELECT 1; COMMIX"},                 // same length
		{"SAVEPOINT a", "SAVEPOINT b"},                           // same shape, other savepoint
		{`SELECT '\'; COMMIT; --'`, `SELECT '\'; SELECT 1; --'`}, // readings differ
	} {
		for _, order := range [][2]string{{pair[0], pair[1]}, {pair[1], pair[0]}} {
			for _, q := range order {
				for range 2 {
					check(t, sqlguard.PostgreSQL, q)
				}
			}
		}
	}

	q := "SAVEPOINT poison; SELECT 1"
	for range 2 { // the first may miss, the second is the cache's own
		vs := sqlguard.ReadAll(sqlguard.PostgreSQL, q)
		vs[0].Refused = "poisoned"
		vs[0].Ops[0].Name = "other"
		vs[0].Ops = append(vs[0].Ops[:0], sqlguard.SavepointOp{Kind: sqlguard.Release, Name: "x"})
		check(t, sqlguard.PostgreSQL, q)
	}
}

// TestCacheBounded: a handler that sends ever new texts, short and long,
// never makes the cache hold more than CacheEntries of them, nor any text
// longer than CacheMaxText; the texts in use stay answered correctly.
func TestCacheBounded(t *testing.T) {
	var c sqlguard.IntCache
	for i := range 20 * sqlguard.CacheEntries {
		c.Put(fmt.Sprintf("SELECT %d", i), i)
		if n := c.Len(); n > sqlguard.CacheEntries {
			t.Fatalf("after %d texts the cache holds %d, more than %d", i+1, n, sqlguard.CacheEntries)
		}
	}
	huge := strings.Repeat("y", sqlguard.CacheMaxText+1)
	c.Put(huge, 1)
	if _, ok := c.Get(huge); ok {
		t.Errorf("a text of %d bytes was kept", len(huge))
	}

	// The same through the guard's own caches: flood them, then check
	// the cases.
	for i := range 4 * sqlguard.CacheEntries {
		q := fmt.Sprintf("SELECT %d", i)
		sqlguard.TxControl(sqlguard.PostgreSQL, q)
		sqlguard.ReadAll(sqlguard.PostgreSQL, q)
		sqlguard.TxControl(sqlguard.PostgreSQL, q+strings.Repeat(" ", sqlguard.CacheMaxText))
	}
	if tc, ra := sqlguard.CacheLens(sqlguard.PostgreSQL); tc > sqlguard.CacheEntries || ra > sqlguard.CacheEntries {
		t.Errorf("TxControl's cache holds %d texts, sqlguard.ReadAll's %d: more than %d", tc, ra, sqlguard.CacheEntries)
	}
	for _, c := range guardtest.Cases {
		check(t, c.Dialect, c.SQL)
	}
}

// TestCacheKeepsTextsInUse: a text asked for again after others moves
// back to the young generation, so a flood of new texts evicts it only
// after CacheEntries/2 of them.
func TestCacheKeepsTextsInUse(t *testing.T) {
	var c sqlguard.IntCache
	c.Put("hot", 1)
	for i := range 10 * sqlguard.CacheEntries {
		c.Put(fmt.Sprintf("cold %d", i), i)
		if i%(sqlguard.CacheEntries/4) == 0 {
			if v, ok := c.Get("hot"); !ok || v != 1 {
				t.Fatalf("after %d other texts the text in use is gone (%d, %v)", i+1, v, ok)
			}
		}
	}
}

// TestCacheConcurrent: the caches are safe for concurrent use (run with
// -race) and answer each goroutine as the lexer does.
func TestCacheConcurrent(t *testing.T) {
	texts := guardtest.Texts(sqlguard.PostgreSQL, 200, 7)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				q := texts[(i*7+g)%len(texts)]
				if i%3 == 0 {
					q = fmt.Sprintf("%s -- %d %d", q, g, i) // new texts, evicting
				}
				check(t, sqlguard.PostgreSQL, q)
			}
		}()
	}
	wg.Wait()
}

// BenchmarkTxControlLexed is BenchmarkTxControl's statement without the
// cache: what every call cost when each was lexed.
func BenchmarkTxControlLexed(b *testing.B) {
	q := "INSERT INTO payments (id, account, amount, currency, description) VALUES ($1, $2, $3, $4, $5)"
	for b.Loop() {
		sqlguard.TxControlUncached(sqlguard.PostgreSQL, q)
	}
}
