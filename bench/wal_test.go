package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWALPerRequest measures what PostgreSQL writes for each variant:
// bytes of WAL per first request and per replay, the mean of n sequential
// requests, each variant on emptied tables right after a CHECKPOINT. Unlike
// throughput on a shared machine this hardly depends on load (other
// databases on the server add a little; run it alone). It empties the
// benchmark tables.
//
//	go test -count=1 -v -run TestWALPerRequest .
func TestWALPerRequest(t *testing.T) {
	const n = 200
	ctx, admin := setupTest(t)
	lsn := func() int64 {
		var v int64
		if err := admin.QueryRow(ctx, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	var table strings.Builder
	fmt.Fprintf(&table, "| variant | WAL bytes per first request | WAL bytes per replay |\n|---|---:|---:|\n")
	for _, v := range testVariants(ctx) {
		h, closeFn, err := v.open(&Counter{})
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		// Every variant starts from empty tables right after a checkpoint,
		// so none pays more full-page images than another for a bigger
		// index or a checkpoint that fell into its measurement.
		if err := Truncate(ctx, admin); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		prefix := RandHex(4)
		post := func(key string, want int) {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments",
				strings.NewReader(`{"amount":1000,"currency":"EUR","description":"coffee"}`))
			req.Header.Set("Authorization", "Bearer acct_wal")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", prefix+"-"+key)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != want {
				t.Fatalf("%s: status %d, want %d", v.name, resp.StatusCode, want)
			}
		}
		for i := range 20 { // warm the pool and the statement caches
			post(fmt.Sprint("warm", i), http.StatusCreated)
		}
		start := lsn()
		for i := range n {
			post(fmt.Sprint("k", i), http.StatusCreated)
		}
		mid := lsn()
		for i := range n {
			post(fmt.Sprint("k", i), http.StatusCreated)
		}
		end := lsn()
		first, replay := float64(mid-start)/n, float64(end-mid)/n
		t.Logf("%s: %.0f WAL bytes per first request, %.1f per replay", v.name, first, replay)
		fmt.Fprintf(&table, "| %s | %.0f | %.1f |\n", v.name, first, replay)
		srv.Close()
		closeFn()
	}
	t.Logf("WAL per request (mean of %d):\n%s", n, table.String())
}
