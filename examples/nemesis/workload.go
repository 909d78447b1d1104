package main

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// answer is one final answer a key got: a status and the exact body.
type answer struct {
	status int
	body   string
}

// keyHistory is what the clients saw of one key.
type keyHistory struct {
	account, key string
	// answers are the final answers, in order: the first, and the
	// confirming retry's after a 201.
	answers []answer
	// fresh counts 201s without Idempotent-Replayed.
	fresh    int
	attempts int
	// took is the time from the first attempt to the first final answer.
	took time.Duration
	// trail is every attempt: when (from the first), where, and the answer.
	trail []string
	start time.Time
	// unknown is set when the key was answered 409 outcome-unknown: the
	// service keeps it until an operator or Reconcile resolves it.
	unknown bool
}

// got201 reports whether any final answer was a 201.
func (h *keyHistory) got201() bool {
	for _, a := range h.answers {
		if a.status == http.StatusCreated {
			return true
		}
	}
	return false
}

// workload is the clients: each makes payments with fresh keys, one at a
// time, and retries every key with the same body until a final answer.
type workload struct {
	instances  []*instance
	clients    int
	keyTimeout time.Duration
	run        string // distinguishes this run's accounts

	mu        sync.Mutex
	histories []*keyHistory
	requests  atomic.Int64
	statuses  sync.Map // status or "error" -> *atomic.Int64
}

func (w *workload) count(what string) {
	v, _ := w.statuses.LoadOrStore(what, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// drive runs the clients until load ends (no new keys after it), then
// lets each finish its key within keyTimeout; abort ends everything.
func (w *workload) drive(load, abort context.Context) {
	var wg sync.WaitGroup
	for c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 10 * time.Second}
			for n := 0; load.Err() == nil; n++ {
				h := &keyHistory{account: fmt.Sprintf("nm%s-c%d-k%d", w.run, c, n), key: randomKey()}
				w.mu.Lock()
				w.histories = append(w.histories, h)
				w.mu.Unlock()
				w.settle(abort, hc, h, c+n, n)
			}
		}()
	}
	wg.Wait()
}

func randomKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// settle retries h's key until a final answer or keyTimeout, then sends
// one confirming retry to the next instance after a 201.
func (w *workload) settle(ctx context.Context, hc *http.Client, h *keyHistory, first, n int) {
	ctx, cancel := context.WithTimeout(ctx, w.keyTimeout)
	defer cancel()
	body := fmt.Sprintf(`{"amount": %d, "currency": "EUR", "description": "nemesis %s"}`, 100+n, h.key)
	target := first
	start := time.Now()
	h.start = start
	for round := 0; round < 2 && ctx.Err() == nil; round++ {
		a, ok := w.untilFinal(ctx, hc, h, body, &target)
		if !ok {
			return
		}
		if round == 0 {
			h.took = time.Since(start)
		}
		h.answers = append(h.answers, a)
		if a.status != http.StatusCreated {
			return
		}
		target++ // the confirming retry goes to another instance
	}
}

// untilFinal sends the request until a final answer: 201, a 4xx other
// than 409 and 429, or 409 outcome-unknown. Network errors, 409, 429 and
// 5xx are retried, after Retry-After when the answer has one.
func (w *workload) untilFinal(ctx context.Context, hc *http.Client, h *keyHistory, body string, target *int) (answer, bool) {
	for try := 0; ctx.Err() == nil; try++ {
		in := w.instances[*target%len(w.instances)]
		*target++
		h.attempts++
		w.requests.Add(1)
		sent := time.Since(h.start)
		status, hdr, b, err := post(ctx, hc, in.base()+"/payments", h.account, h.key, body)
		h.trail = append(h.trail, fmt.Sprintf("+%.2fs %s %s", sent.Seconds(), in.name, trailAnswer(status, hdr, err)))
		if err != nil {
			w.count("error")
			sleep(ctx, backoff(try))
			continue
		}
		w.count(strconv.Itoa(status))
		switch {
		case status == http.StatusCreated:
			if hdr.Get("Idempotent-Replayed") != "true" {
				h.fresh++
			}
			return answer{status, string(b)}, true
		case status == http.StatusConflict && strings.Contains(string(b), "outcome-unknown"):
			h.unknown = true
			return answer{}, false
		case status == http.StatusConflict || status == http.StatusTooManyRequests || status >= 500:
			wait := backoff(try)
			if s, err := strconv.Atoi(hdr.Get("Retry-After")); err == nil && s >= 0 {
				wait = min(time.Duration(s)*time.Second, 10*time.Second)
			}
			sleep(ctx, wait)
		default:
			return answer{status, string(b)}, true
		}
	}
	return answer{}, false
}

// trailAnswer is one attempt's answer in a key's trail.
func trailAnswer(status int, hdr http.Header, err error) string {
	switch {
	case err != nil:
		return "error"
	case hdr.Get("Retry-After") != "":
		return fmt.Sprintf("%d(Retry-After %s)", status, hdr.Get("Retry-After"))
	case hdr.Get("Idempotent-Replayed") == "true":
		return fmt.Sprintf("%d(replayed)", status)
	}
	return strconv.Itoa(status)
}

func backoff(try int) time.Duration {
	d := 100 * time.Millisecond << min(try, 4)
	return min(d, 2*time.Second)/2 + rand.N(min(d, 2*time.Second)/2+1)
}

func post(ctx context.Context, hc *http.Client, url, account, key, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, b, nil
}

// charges reads every charge the fake provider made, per account.
func charges(ctx context.Context, base string) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/charges", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the provider's charges: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Charges []struct {
			Account string `json:"account"`
		} `json:"charges"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&out); err != nil {
		return nil, fmt.Errorf("the provider's charges %q: %w", b, err)
	}
	m := map[string]int{}
	for _, c := range out.Charges {
		m[c.Account]++
	}
	return m, nil
}
