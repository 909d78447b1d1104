// Command payclient pays through the example payments service with
// idemclient, the client half of idem: every payment gets one
// Idempotency-Key, and every retry reuses it.
//
//	go run ./examples/payments -handler-delay 1s &   # the service, on 127.0.0.1:8080
//	go run ./examples/payments/payclient             # or -base http://127.0.0.1:PORT
//
// It makes two orders:
//
//  1. One whose first answer is lost on the way back (simulated here, in
//     the client: the 201 arrives and is thrown away). idemclient retries
//     with the same key, and the service replays the stored 201.
//  2. One sent twice at once with the same key (WithKey), as a client that
//     retries while its first try still runs. The second try gets 409
//     key-in-use, waits out Retry-After (capped at 1s here) and gets the
//     replay. Start the service with -handler-delay 1s to see the 409.
//
// Then it lists the account's payments: one per order. Only loopback
// addresses are accepted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	idemclient "github.com/idemgo/idem/client"
)

func main() {
	base := flag.String("base", "http://127.0.0.1:8080", "the payments service (loopback only)")
	account := flag.String("account", fmt.Sprintf("carol-%d", time.Now().UnixNano()%100000), "the account (bearer token)")
	flag.Parse()
	if err := run(*base, *account); err != nil {
		fmt.Fprintln(os.Stderr, "payclient:", err)
		os.Exit(1)
	}
}

func run(base, account string) error {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || (u.Hostname() != "localhost" && !strings.HasPrefix(u.Hostname(), "127.") && u.Hostname() != "::1") {
		return fmt.Errorf("-base must be a loopback http address (http://127.0.0.1:PORT), got %q", base)
	}
	base = strings.TrimSuffix(base, "/")

	lossy := &loseFirstAnswer{base: http.DefaultTransport}
	rt, err := idemclient.New(idemclient.Config{
		Base:          lossy,
		MaxRetryAfter: time.Second, // the service's 409 asks for the rest of its lease
	})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: rt, Timeout: 30 * time.Second}

	fmt.Println("# 1. The first answer is lost on the way back; the retry carries the same key")
	lossy.armed.Store(true)
	r, err := pay(context.Background(), client, base, account, `{"amount": 1250, "currency": "EUR", "description": "Order #2001"}`)
	if err != nil {
		return err
	}
	fmt.Println(r)

	fmt.Println("\n# 2. One order sent twice at once with the same key (WithKey); the second waits out the 409")
	key := idemclient.NewKey()
	var (
		wg      sync.WaitGroup
		results [2]string
		errs    [2]error
	)
	for i := range results {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 200 * time.Millisecond)
			ctx := idemclient.WithKey(context.Background(), key)
			results[i], errs[i] = pay(ctx, client, base, account, `{"amount": 4200, "currency": "EUR", "description": "Order #2002"}`)
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	for i, r := range results {
		fmt.Printf("try %d: %s\n", i+1, r)
	}

	fmt.Println("\n# 3. The account's payments: one per order")
	req, _ := http.NewRequest("GET", base+"/payments", nil)
	req.Header.Set("Authorization", "Bearer "+account)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var list struct {
		Payments []struct {
			ID          string `json:"id"`
			Amount      int    `json:"amount"`
			Description string `json:"description"`
		} `json:"payments"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return fmt.Errorf("GET /payments: %d: %w", resp.StatusCode, err)
	}
	for _, p := range list.Payments {
		fmt.Printf("%s %d %s\n", p.ID, p.Amount, p.Description)
	}
	return nil
}

// pay sends one POST /payments and describes what came back.
func pay(ctx context.Context, c *http.Client, base, account, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/payments", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	info, _ := idemclient.Info(resp)
	var p struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &p)
	return fmt.Sprintf("%d %s  attempts=%d replayed=%v key=%s", resp.StatusCode, p.ID, info.Attempts, info.Replayed, info.Key), nil
}

// loseFirstAnswer simulates a connection cut after the service committed:
// once armed, it reads the next answer to the end and returns an error
// instead of it.
type loseFirstAnswer struct {
	base  http.RoundTripper
	armed atomic.Bool
}

func (l *loseFirstAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err != nil || !l.armed.CompareAndSwap(true, false) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	fmt.Printf("(simulated: the %d answer was lost on the way back)\n", resp.StatusCode)
	return nil, errors.New("payclient: the answer was lost on the way back (simulated)")
}
