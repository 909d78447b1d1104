package sqlguard

import (
	"slices"
	"strings"
	"sync"
)

// A handler sends the same few statement texts over and over, with their
// values as parameters, and the guard's verdict is a function of the
// dialect and the text alone. TxControl and ReadAll remember it per text,
// so that a text is lexed once rather than on every call.
//
// The cache is built so that what a handler sends cannot change what the
// guard answers for any other text, nor grow it:
//
//   - The key is the whole text, compared byte for byte (a copy of it, so
//     that the caller's memory is neither kept nor read later); texts
//     longer than cacheMaxText are read every time and never stored.
//   - It holds at most cacheEntries texts, so at most cacheEntries ×
//     cacheMaxText bytes of them, in two generations: new texts go into
//     the young one; when it is full, the old one is dropped and the young
//     one becomes old; a text found in the old one moves back to the young
//     one. A stream of new texts evicts the texts in use only after
//     cacheEntries/2 of them, and costs nothing but the lexing the cache
//     would have saved.
//   - The verdicts it hands out are copies, so a caller that changes one
//     changes nothing another caller gets.
const (
	cacheEntries = 1024
	cacheMaxText = 2048
)

// cache is a bounded map from statement text to verdict, safe for
// concurrent use. The zero value is empty and ready.
type cache[V any] struct {
	mu         sync.Mutex
	young, old map[string]V
}

// get returns the verdict stored for q.
func (c *cache[V]) get(q string) (V, bool) {
	if len(q) > cacheMaxText {
		var zero V
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.young[q]; ok {
		return v, true
	}
	v, ok := c.old[q]
	if ok {
		delete(c.old, q)
		c.addLocked(strings.Clone(q), v)
	}
	return v, ok
}

// put stores v as the verdict for q, unless q is too long to keep.
func (c *cache[V]) put(q string, v V) {
	if len(q) > cacheMaxText {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.young[q]; ok {
		return
	}
	c.addLocked(strings.Clone(q), v)
}

func (c *cache[V]) addLocked(q string, v V) {
	if len(c.young) >= cacheEntries/2 {
		c.old, c.young = c.young, nil
	}
	if c.young == nil {
		c.young = make(map[string]V, cacheEntries/2)
	}
	c.young[q] = v
}

// len returns how many texts the cache holds.
func (c *cache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.young) + len(c.old)
}

// txControlVerdict is what TxControl returns for a text.
type txControlVerdict struct {
	words   string
	refused bool
}

// Each dialect's caches, indexed by Dialect (its zero value unused).
var (
	txControlCache [SQLite + 1]cache[txControlVerdict]
	readAllCache   [SQLite + 1]cache[[]Verdict]
)

// known reports whether d is one of the dialects the caches are for.
func (d Dialect) known() bool { return d >= PostgreSQL && d <= SQLite }

// cloneVerdicts returns a copy of vs that shares no memory with it.
func cloneVerdicts(vs []Verdict) []Verdict {
	out := slices.Clone(vs)
	for i := range out {
		out[i].Ops = slices.Clone(out[i].Ops)
	}
	return out
}
