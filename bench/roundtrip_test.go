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

	variants := testVariants(ctx)

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
		h, closeFn, err := v.open(c)
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
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
				t.Fatalf("%s: %v", v.name, err)
			}
			_ = resp.Body.Close()
			return resp
		}
		const body = `{"amount":1000,"currency":"EUR","description":"coffee"}`
		// Warm both connections and every statement: a first request, its
		// replay, a 422, and a held request with a 409 beside it.
		for i := range 3 {
			post(fmt.Sprint("warm", i), body, false)
			post(fmt.Sprint("warm", i), body, false)
			post(fmt.Sprint("warm", i), `{"amount":1}`, false)
		}
		heldDone := make(chan *http.Response)
		go func() { heldDone <- post("warm-held", body, true) }()
		time.Sleep(300 * time.Millisecond)
		post("warm-held", body, false)
		release()
		<-heldDone

		// most bounds the round trips of the library's variants (the
		// floor has no bound); 0 leaves a measure unbounded.
		measure := func(name string, want int, most int64, fn func() *http.Response) string {
			c.Reset()
			resp := fn()
			if resp.StatusCode != want {
				t.Errorf("%s %s: status %d, want %d", v.name, name, resp.StatusCode, want)
			}
			turns, traced := c.Turns.Load(), c.Traced()
			t.Logf("%s, %s: %d round trips on the socket, %d statements/batches traced", v.name, name, turns, traced)
			if most > 0 && v.most && turns > most {
				t.Errorf("%s, %s: %d round trips, want at most %d", v.name, name, turns, most)
			}
			if turns == traced {
				return fmt.Sprint(turns)
			}
			return fmt.Sprintf("%d (tracer: %d)", turns, traced)
		}
		// A first request: claim, BEGIN, the handler's INSERT, and the
		// settle pipelined with COMMIT (idemgorm through pgx's
		// database/sql driver too). A replay: the claim alone.
		first := measure("first request", http.StatusCreated, 4, func() *http.Response { return post("k1", body, false) })
		replay := measure("replay", http.StatusCreated, 1, func() *http.Response {
			resp := post("k1", body, false)
			if v.name != "" && resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s: not a replay", v.name)
			}
			return resp
		})
		go func() { heldDone <- post("k2", body, true) }()
		time.Sleep(300 * time.Millisecond)
		conflict := measure("409", http.StatusConflict, 0, func() *http.Response { return post("k2", body, false) })
		release()
		<-heldDone
		mismatch := measure("422", http.StatusUnprocessableEntity, 0, func() *http.Response {
			return post("k1", `{"amount":2000,"currency":"EUR","description":"coffee"}`, false)
		})
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %s |\n", v.name, first, replay, conflict, mismatch)
		srv.Close()
		closeFn()
	}
	t.Logf("round trips per request (socket turns; the tracer's count in brackets where it differs):\n%s", table.String())
}

// variant is one server the round-trip and WAL tests measure.
type variant struct {
	name string
	open func(c *Counter) (http.Handler, func(), error)
	most bool // TestRoundTrips bounds its round trips (the library's variants)
}

// testVariants returns idemhttp+idempgx, idemhttp+idemgorm and the floor,
// each on its own small pool counted by c.
func testVariants(ctx context.Context) []variant {
	return []variant{
		{"idem + idempgx", func(c *Counter) (http.Handler, func(), error) {
			pool, err := OpenPool(ctx, 2, c)
			if err != nil {
				return nil, nil, err
			}
			h, err := NewPgxServer(ctx, pool)
			return h, pool.Close, err
		}, true},
		{"idem + idemgorm (PostgreSQL)", func(c *Counter) (http.Handler, func(), error) {
			db, closeDB, err := OpenGorm(2, c)
			if err != nil {
				return nil, nil, err
			}
			h, err := NewGormServer(ctx, db)
			return h, func() { _ = closeDB() }, err
		}, true},
		{"hand-written floor (pgx)", func(c *Counter) (http.Handler, func(), error) {
			pool, err := OpenPool(ctx, 2, c)
			if err != nil {
				return nil, nil, err
			}
			return &Floor{Pool: pool}, pool.Close, nil
		}, false},
	}
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
