package sqlguard

// The caches' insides, for cache_test.go.
var (
	TxControlUncached = txControl
	ReadAllUncached   = readAll
)

const (
	CacheEntries = cacheEntries
	CacheMaxText = cacheMaxText
)

// CacheLens returns how many texts TxControl's and ReadAll's caches for d
// hold.
func CacheLens(d Dialect) (txControl, readAll int) {
	return txControlCache[d].len(), readAllCache[d].len()
}

// IntCache is a cache of ints.
type IntCache struct{ c cache[int] }

func (c *IntCache) Put(q string, v int)      { c.c.put(q, v) }
func (c *IntCache) Get(q string) (int, bool) { return c.c.get(q) }
func (c *IntCache) Len() int                 { return c.c.len() }
