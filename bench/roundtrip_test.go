package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRoundTrips counts, per HTTP request through a real server on
// 127.0.0.1, what reaches PostgreSQL for the first request of a key, its
// replay, a 409 (same key while the first holds it) and a 422 (same key,
// other body): through idemhttp+idempgx, idemhttp+idemgorm and the
// hand-written floor. The handler's own share is one INSERT. Connections
// are warmed first, so pgx's statement cache is full.
//
//	go test -count=1 -v -run TestRoundTrips .
func TestRoundTrips(t *testing.T) {
	ctx, _ := setupTest(t)
	roundTrips(ctx, t, postgresVariants())
}

// TestRoundTripsOtherStores is TestRoundTrips for idemgorm on MariaDB and
// on SQLite and for idemredis, each beside its hand-written floor, on
// tables and key prefixes of its own (OpenTarget). On MariaDB and Redis it
// counts turns on the sockets (for Redis both Redis's and the payment's
// PostgreSQL); SQLite runs in the process, so there it counts statements
// (BEGIN, COMMIT and ROLLBACK included).
//
//	go test -count=1 -v -run TestRoundTripsOtherStores .
func TestRoundTripsOtherStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, db := range Databases[1:] {
		t.Run(db, func(t *testing.T) {
			target, err := OpenTarget(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			roundTrips(ctx, t, target.Variants)
		})
	}
}

// roundTrips counts, per HTTP request to each variant, its round trips (or
// statements where no socket turns were counted) for a first request, a
// replay, a 409 and a 422, and fails when a library variant exceeds its
// bounds.
func roundTrips(ctx context.Context, t *testing.T, variants []Variant) {
	Hold = make(chan struct{})
	defer func() { Hold = nil }()
	// release lets a held handler go on; it gave up by itself after 10 s
	// if something (another client's lock) delayed the test that long.
	release := func() {
		select {
		case Hold <- struct{}{}:
		case <-time.After(11 * time.Second):
			t.Error("the held handler did not wait for its release")
		}
	}

	var table strings.Builder
	fmt.Fprintf(&table, "| variant | first request (handler: 1) | replay | 409 in progress | 422 other body |\n|---|---|---|---|---|\n")
	for _, v := range variants {
		c := &Counter{}
		h, closeFn, err := v.Open(ctx, 2, c)
		if err != nil {
			t.Fatalf("%s: %v", v.Label, err)
		}
		srv := httptest.NewServer(h)
		client := srv.Client()
		prefix := RandHex(4)
		post := func(key, body string, hold bool) *http.Response {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer acct_rt")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", prefix+"-"+key)
			if hold {
				req.Header.Set("X-Bench-Hold", "1")
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", v.Label, err)
			}
			_ = resp.Body.Close()
			return resp
		}
		const body = `{"amount":1000,"currency":"EUR","description":"coffee"}`
		// conflict holds a request on key and runs during, which may post
		// a second one with second, unless the variant cannot answer it.
		conflict := func(key string, during func(second func() *http.Response)) {
			if v.NoHold {
				return
			}
			heldDone := make(chan *http.Response)
			go func() { heldDone <- post(key, body, true) }()
			time.Sleep(300 * time.Millisecond)
			during(func() *http.Response { return post(key, body, false) })
			release()
			<-heldDone
		}
		// Warm both connections and every statement: a first request, its
		// replay, a 422, and a held request with a 409 beside it.
		for i := range 3 {
			post(fmt.Sprint("warm", i), body, false)
			post(fmt.Sprint("warm", i), body, false)
			post(fmt.Sprint("warm", i), `{"amount":1}`, false)
		}
		conflict("warm-held", func(second func() *http.Response) { second() })

		// count runs fn and returns what it cost: socket turns, or where
		// there were none (SQLite) statements; and the cell for the table.
		count := func(name string, want int, fn func() *http.Response) (int64, string) {
			c.Reset()
			resp := fn()
			if resp.StatusCode != want {
				t.Errorf("%s %s: status %d, want %d", v.Label, name, resp.StatusCode, want)
			}
			turns, traced := c.Turns.Load(), c.Traced()
			t.Logf("%s, %s: %d round trips on the socket, %d statements/batches traced", v.Label, name, turns, traced)
			switch {
			case turns == 0:
				return traced, fmt.Sprintf("%d statements", traced)
			case turns == traced:
				return turns, fmt.Sprint(turns)
			case traced == 0:
				return turns, fmt.Sprint(turns)
			}
			return turns, fmt.Sprintf("%d (tracer: %d)", turns, traced)
		}
		measure := func(name string, want int, most int64, fn func() *http.Response) string {
			n, cell := count(name, want, fn)
			if most > 0 && n > most {
				t.Errorf("%s, %s: %d round trips (or statements), want at most %d", v.Label, name, n, most)
			}
			return cell
		}
		// On PostgreSQL a first request is the claim, the handler's INSERT
		// (behind BEGIN, on idempgx in the same batch), and the settle
		// pipelined with COMMIT (idemgorm through pgx's database/sql driver
		// too); a replay the claim alone.
		first := measure("first request", http.StatusCreated, v.First, func() *http.Response { return post("k1", body, false) })
		replay := measure("replay", http.StatusCreated, v.Replay, func() *http.Response {
			resp := post("k1", body, false)
			if resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s: not a replay", v.Label)
			}
			return resp
		})
		inProgress := "–"
		conflict("k2", func(second func() *http.Response) {
			inProgress = measure("409", http.StatusConflict, 0, second)
		})
		mismatch := measure("422", http.StatusUnprocessableEntity, 0, func() *http.Response {
			return post("k1", `{"amount":2000,"currency":"EUR","description":"coffee"}`, false)
		})
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %s |\n", v.Label, first, replay, inProgress, mismatch)
		srv.Close()
		closeFn()
	}
	t.Logf("round trips per request (socket turns; the tracer's count in brackets where it differs; statements on SQLite):\n%s", table.String())
}

// setupTest returns a context bounded to two minutes and a small pool on
// which the benchmark tables exist (Setup), both cleaned up with t.
func setupTest(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	pool, err := OpenPool(ctx, 2, nil)
	if err != nil {
		t.Fatalf("the benchmarks need PostgreSQL (IDEM_PG_DSN, default %s): %v", DefaultDSN, err)
	}
	t.Cleanup(pool.Close)
	if err := Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return ctx, pool
}
