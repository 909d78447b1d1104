package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idemclient "github.com/idemgo/idem/client"
	"github.com/idemgo/idem/core/storetest/faultproxy"
)

// TestClientThroughFaults runs idemclient against the example service
// behind faultproxy, which cuts the client's connections at three moments:
// before the request reaches the service, after the service has it (before
// any answer), and after the service committed and sent its 201 (the
// answer is lost on the way). A fourth case sends the same key twice at
// once, as a client that retries while its first try is still running:
// the second gets 409 key-in-use with Retry-After and waits for the replay.
//
// Every operation must end with exactly one payment for its account, and
// the caller must get a 201 whose body is that payment; where the first
// success's answer was lost, byte for byte the body that answer carried.
func TestClientThroughFaults(t *testing.T) {
	for _, store := range []string{"sqlite", "memory"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			// A short lease, as in the crash test: a claim left in
			// progress by an attempt whose connection was cut is taken
			// over within the client's budget.
			p := startService(t, "-store", store, "-dsn", newDatabase(t, store), "-handler-delay", "300ms",
				"-request-timeout", "2s", "-store-timeout", "1s", "-lease", "4s")
			proxy, err := faultproxy.New(strings.TrimPrefix(p.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			lost := &answerCutter{proxy: proxy}
			base := &http.Transport{
				// One connection per attempt, so that each cut is seen by
				// idemclient and not absorbed by net/http's own resend on a
				// kept-alive connection.
				DisableKeepAlives:  true,
				DisableCompression: true,
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &cutterConn{Conn: c, cutter: lost}, nil
				},
			}
			t.Cleanup(base.CloseIdleConnections)
			rt, err := idemclient.New(idemclient.Config{
				Base:          base,
				MaxAttempts:   20,
				MaxElapsed:    30 * time.Second,
				BaseDelay:     50 * time.Millisecond,
				MaxDelay:      500 * time.Millisecond,
				MaxRetryAfter: time.Second, // the service's 409 asks for the rest of the lease
			})
			if err != nil {
				t.Fatal(err)
			}
			c := &http.Client{Transport: rt, Timeout: 60 * time.Second}
			url := "http://" + proxy.Addr() + "/payments"

			const ops = 2
			for i := range ops {
				t.Run(fmt.Sprintf("no fault/%d", i), func(t *testing.T) {
					res := pay(t, c, url, account(t), "")
					checkOne(t, p.base, res)
					if res.info.Attempts != 1 || res.info.Replayed {
						t.Errorf("Info %+v, want one attempt, not replayed", res.info)
					}
				})
			}
			for _, when := range []struct {
				name string
				when faultproxy.When
			}{{"cut before the request", faultproxy.Before}, {"cut after the request", faultproxy.After}} {
				for i := range ops {
					t.Run(fmt.Sprintf("%s/%d", when.name, i), func(t *testing.T) {
						marker := "e2e-" + randHex(6)
						cuts := proxy.Cuts()
						fired := proxy.CutOn([]byte(marker), when.when)
						defer proxy.Disarm()
						res := pay(t, c, url, account(t), marker)
						select {
						case <-fired:
						default:
							t.Fatal("the proxy never cut the request")
						}
						if proxy.Cuts() == cuts {
							t.Fatal("the proxy counted no cut")
						}
						checkOne(t, p.base, res)
						if res.info.Attempts < 2 {
							t.Errorf("Info %+v, want a retry after the cut", res.info)
						}
					})
				}
			}
			for i := range ops {
				t.Run(fmt.Sprintf("cut after the answer was committed/%d", i), func(t *testing.T) {
					marker := "e2e-" + randHex(6)
					lost.arm(marker)
					res := pay(t, c, url, account(t), marker)
					status, body, ok := lost.taken()
					if !ok {
						t.Fatal("no answer was cut")
					}
					if status != http.StatusCreated {
						t.Fatalf("the lost answer was %d %s, want the first success's 201", status, body)
					}
					checkOne(t, p.base, res)
					if !res.info.Replayed || res.info.Attempts < 2 {
						t.Errorf("Info %+v, want a replay after a retry", res.info)
					}
					if !bytes.Equal(res.body, body) {
						t.Errorf("the caller got\n%s\nthe first success sent\n%s", res.body, body)
					}
				})
			}
			for i := range ops {
				t.Run(fmt.Sprintf("same key twice at once/%d", i), func(t *testing.T) {
					acct, key := account(t), idemclient.NewKey()
					var wg sync.WaitGroup
					results := make([]payResult, 2)
					for j := range results {
						wg.Go(func() {
							time.Sleep(time.Duration(j) * 100 * time.Millisecond) // the second while the first sleeps in the handler
							results[j] = payCtx(idemclient.WithKey(context.Background(), key), c, url, acct, "")
						})
					}
					wg.Wait()
					for j, r := range results {
						if r.err != nil {
							t.Fatalf("try %d: %v", j+1, r.err)
						}
						checkOne(t, p.base, r)
						if r.info.Key != key {
							t.Errorf("try %d sent key %q, want %q", j+1, r.info.Key, key)
						}
					}
					if !bytes.Equal(results[0].body, results[1].body) {
						t.Errorf("two answers for one key:\n%s\n%s", results[0].body, results[1].body)
					}
					if !results[1].info.Replayed || results[1].info.Attempts < 2 {
						t.Errorf("second try %+v, want a replay after a 409", results[1].info)
					}
				})
			}
		})
	}
}

// payResult is one operation as the caller saw it.
type payResult struct {
	acct   string
	status int
	body   []byte
	info   idemclient.Result
	took   time.Duration
	err    error
}

func pay(t *testing.T, c *http.Client, url, acct, description string) payResult {
	t.Helper()
	r := payCtx(context.Background(), c, url, acct, description)
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r
}

// payCtx sends one POST /payments through c (no key of its own: idemclient
// adds it) and reads the whole answer. It may run on another goroutine.
func payCtx(ctx context.Context, c *http.Client, url, acct, description string) payResult {
	body := fmt.Sprintf(`{"amount": 1250, "currency": "EUR", "description": %q}`, description)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return payResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+acct)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return payResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	info, ok := idemclient.Info(resp)
	if err == nil && !ok {
		err = errors.New("idemclient.Info found no result")
	}
	return payResult{acct: acct, status: resp.StatusCode, body: b, info: info, took: time.Since(start), err: err}
}

// checkOne: the operation got a 201, and its account has exactly one
// payment, the one in the body.
func checkOne(t *testing.T, base string, r payResult) {
	t.Helper()
	t.Logf("%s: %d after %d attempt(s) in %v, replayed %v, key %s", r.acct, r.status, r.info.Attempts,
		r.took.Round(time.Millisecond), r.info.Replayed, r.info.Key)
	if r.status != http.StatusCreated {
		t.Fatalf("%d %s (Info %+v), want 201", r.status, r.body, r.info)
	}
	got := decodePayment(t, reply{status: r.status, body: r.body})
	ps := listPayments(t, base, r.acct)
	if len(ps) != 1 || ps[0] != got {
		t.Fatalf("%s has payments %+v, want exactly the one answered, %+v", r.acct, ps, got)
	}
}

// answerCutter loses one answer: armed with a marker, the connection whose
// request carries it reads the service's whole answer as soon as its first
// bytes arrive (the service sends nothing before its commit), keeps it,
// has the fault proxy cut every connection (the service may have closed
// its end already), and gives the client an error instead of the answer.
type answerCutter struct {
	proxy *faultproxy.Proxy

	mu     sync.Mutex
	marker []byte
	done   bool
	status int
	body   []byte
}

func (a *answerCutter) arm(marker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.marker, a.done, a.status, a.body = []byte(marker), false, 0, nil
}

// claim reports whether b carries the armed marker, and disarms it.
func (a *answerCutter) claim(b []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.marker == nil || !bytes.Contains(b, a.marker) {
		return false
	}
	a.marker = nil
	return true
}

func (a *answerCutter) keep(status int, body []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done, a.status, a.body = true, status, body
}

func (a *answerCutter) taken() (int, []byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status, a.body, a.done
}

type cutterConn struct {
	net.Conn
	cutter *answerCutter
	armed  atomic.Bool
}

func (c *cutterConn) Write(b []byte) (int, error) {
	if c.cutter.claim(b) {
		c.armed.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *cutterConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n == 0 || !c.armed.CompareAndSwap(true, false) {
		return n, err
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, rerr := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(b[:n]), c.Conn)), nil)
	if rerr == nil {
		body, _ := io.ReadAll(resp.Body)
		c.cutter.keep(resp.StatusCode, body)
	}
	c.cutter.proxy.CutAll()
	_ = c.Conn.Close()
	return 0, errors.New("e2e: the connection was cut after the answer was committed")
}
