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
// requests, each variant on emptied tables right after a CHECKPOINT. It
// reports the raw LSN difference, which counts every other session on the
// server, and, read with pg_walinspect, the benchmark tables' own records
// by type (walBreakdown), which repeat whatever else runs. It fails when a
// replay writes a record in a transaction of its own (a replay must lock
// and write nothing). It empties the benchmark tables.
//
//	go test -count=1 -v -run TestWALPerRequest .
func TestWALPerRequest(t *testing.T) {
	const n = 200
	ctx, admin := setupTest(t)
	lsn := func() (int64, string) {
		var (
			v int64
			s string
		)
		if err := admin.QueryRow(ctx, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn()::text").Scan(&v, &s); err != nil {
			t.Fatal(err)
		}
		return v, s
	}

	var table strings.Builder
	fmt.Fprintf(&table, "| variant | WAL bytes per first request | own records | WAL bytes per replay | own records |\n|---|---:|---:|---:|---:|\n")
	for _, v := range postgresVariants() {
		h, closeFn, err := v.Open(ctx, 2, &Counter{})
		if err != nil {
			t.Fatalf("%s: %v", v.Label, err)
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
				t.Fatalf("%s: %v", v.Label, err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != want {
				t.Fatalf("%s: status %d, want %d", v.Label, resp.StatusCode, want)
			}
		}
		for i := range 20 { // warm the pool and the statement caches
			post(fmt.Sprint("warm", i), http.StatusCreated)
		}
		start, startLSN := lsn()
		for i := range n {
			post(fmt.Sprint("k", i), http.StatusCreated)
		}
		mid, midLSN := lsn()
		for i := range n {
			post(fmt.Sprint("k", i), http.StatusCreated)
		}
		end, endLSN := lsn()
		first, replay := float64(mid-start)/n, float64(end-mid)/n
		firstStats, err := walBreakdown(ctx, admin, startLSN, midLSN)
		if err != nil {
			t.Fatal(err)
		}
		replayStats, err := walBreakdown(ctx, admin, midLSN, endLSN)
		if err != nil {
			t.Fatal(err)
		}
		// A replay must write nothing: no statement of it may take a
		// transaction id (lock or write a row). Page prunes a read
		// triggers are allowed; they carry none.
		if tx := walTransactional(replayStats); tx > 0 {
			t.Errorf("%s: %d replays wrote %d WAL records in transactions of their own, want none:\n%s",
				v.Label, n, tx, formatBreakdown(replayStats, n))
		}
		own, ownReplay := float64(walTotal(firstStats))/n, float64(walTotal(replayStats))/n
		t.Logf("%s: %.0f WAL bytes per first request (own records %.1f), %.1f per replay (own %.1f); first requests:\n%s",
			v.Label, first, own, replay, ownReplay, formatBreakdown(firstStats, n))
		fmt.Fprintf(&table, "| %s | %.0f | %.1f | %.1f | %.1f |\n", v.Label, first, own, replay, ownReplay)
		srv.Close()
		closeFn()
	}
	t.Logf("WAL per request (mean of %d):\n%s", n, table.String())
}
