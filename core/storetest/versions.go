package storetest

import "testing"

// VersionCount is a Backend.CountWrites count for a store whose table no
// other store uses and whose rows carry a version that any write or lock
// changes (PostgreSQL's xmin, xmax and ctid): read returns each row's
// version by the row's key, and each call of the count adds the rows that
// appeared, went or changed since the last. Writes between two calls count
// at least once.
func VersionCount(t testing.TB, read func() (map[string]string, error)) func() int64 {
	var (
		last  map[string]string
		total int64
	)
	return func() int64 {
		now, err := read()
		if err != nil {
			t.Fatalf("storetest: read the row versions: %v", err)
		}
		for k, v := range now {
			if old, ok := last[k]; !ok || old != v {
				total++
			}
		}
		for k := range last {
			if _, ok := now[k]; !ok {
				total++
			}
		}
		last = now
		return total
	}
}
