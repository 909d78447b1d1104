package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	idemclient "github.com/idemgo/idem/client"
)

// paymentsServer stands in for an idempotent API such as idem's example
// service: it charges once per key, hangs up on the first attempt after
// charging (the answer is lost), and replays the stored answer to a retry.
func paymentsServer() *httptest.Server {
	var (
		mu      sync.Mutex
		charged = map[string]string{}
		calls   int
	)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		calls++
		if body, ok := charged[key]; ok {
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, body)
			return
		}
		charged[key] = fmt.Sprintf(`{"id":"pay_%d"}`, len(charged)+1)
		if calls == 1 {
			c, _, _ := http.NewResponseController(w).Hijack() // the answer is lost
			_ = c.Close()
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, charged[key])
	}))
}

// Example is the set-up: a Transport in an http.Client. The first attempt
// is charged but its answer is lost; the retry carries the same key, so
// the server replays the charge instead of making a second one.
func Example() {
	srv := paymentsServer()
	defer srv.Close()

	rt, err := idemclient.New(idemclient.Config{})
	if err != nil {
		panic(err) // the Config is checked here, at start-up
	}
	client := &http.Client{Transport: rt}

	resp, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":1250}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	info, _ := idemclient.Info(resp)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", info.Attempts, "replayed:", info.Replayed)
	// Output:
	// 201 {"id":"pay_1"}
	// attempts: 2 replayed: true
}

// ExampleWithKey keeps one key across calls of Do: the application stores
// the key with its order before the first request, and sends it again
// after a restart. The server sees that key, not a new one.
func ExampleWithKey() {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	rt, _ := idemclient.New(idemclient.Config{})
	client := &http.Client{Transport: rt}

	orderKey := "order-1001" // stored with the order, e.g. idemclient.NewKey()
	for range 2 {            // the first try, and one after a restart
		ctx := idemclient.WithKey(context.Background(), orderKey)
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader(`{"amount":1250}`))
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
	}
	fmt.Println(seen)
	// Output: [order-1001 order-1001]
}

// ExampleInfo logs what the Transport did, including when the server
// answers with a final error: 422 means the key was used before for
// another request, and is never retried.
func ExampleInfo() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, `{"type":"https://github.com/idemgo/idem/blob/main/docs/problems.md#key-reused","status":422}`)
	}))
	defer srv.Close()
	rt, _ := idemclient.New(idemclient.Config{NewKey: func() string { return "7f3a" }})
	client := &http.Client{Transport: rt}

	resp, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":9900}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	info, ok := idemclient.Info(resp)
	fmt.Printf("status=%d key=%s attempts=%d replayed=%v ok=%v\n", resp.StatusCode, info.Key, info.Attempts, info.Replayed, ok)
	// Output: status=422 key=7f3a attempts=1 replayed=false ok=true
}

// ExampleError: a request that ends without an answer returns an *Error
// with the key and the attempts, inside http.Client's *url.Error.
func ExampleError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := http.NewResponseController(w).Hijack() // every attempt is cut
		_ = c.Close()
	}))
	defer srv.Close()
	rt, _ := idemclient.New(idemclient.Config{
		NewKey:      func() string { return "7f3a" },
		MaxAttempts: 3,
		BaseDelay:   time.Millisecond,
	})
	client := &http.Client{Transport: rt}

	_, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":1250}`))
	var e *idemclient.Error
	if errors.As(err, &e) {
		fmt.Println("key", e.Key, "attempts", e.Attempts)
	}
	// Output: key 7f3a attempts 3
}

// ExampleNew shows a Config refused at start-up: every bad field is named.
func ExampleNew() {
	_, err := idemclient.New(idemclient.Config{MaxAttempts: -1, Header: "Idempotency Key"})
	fmt.Println(errors.Is(err, idemclient.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// idemclient: invalid config: Header must be a header name (an HTTP token), got "Idempotency Key"
	// MaxAttempts must be positive, got -1
}
