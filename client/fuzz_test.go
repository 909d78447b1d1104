package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// fuzzAnswers are the answers a fuzzed server picks from: every status
// class, idem's problem types, Retry-After or none, replays, and
// connections cut before, during and after the request body, and in the
// middle of a committed answer's body.
var fuzzAnswers = []func(ra string) answer{
	func(string) answer { return resp(201) },
	func(string) answer { return replayed(resp(201)) },
	func(ra string) answer { return problem(409, "key-in-use", "Retry-After", ra) },
	func(string) answer { return resp(409) },
	func(ra string) answer { return problem(409, "lease-lost", "Retry-After", ra) },
	func(string) answer { return problem(422, "key-reused") },
	func(ra string) answer { return resp(429, "Retry-After", ra) },
	func(string) answer { return resp(500) },
	func(string) answer { return problem(500, "store-misconfigured") },
	func(ra string) answer { return problem(500, "transaction-ended", "Retry-After", ra) },
	func(string) answer { return resp(502) },
	func(ra string) answer { return problem(503, "store-unavailable", "Retry-After", ra) },
	func(string) answer { return resp(504) },
	func(string) answer { return resp(400) },
	func(string) answer { return problem(400, "body-unreadable") },
	func(string) answer { return cut(0) },
	func(string) answer { return cut(3) },
	func(string) answer { return cut(-1) },
	func(string) answer { return replayed(resp(409)) },
	func(string) answer { a := resp(201); a.body, a.truncated = `{"id":"pay_`, 40; return a },
	func(ra string) answer { return problem(409, "outcome-unknown", "Retry-After", ra) },
}

var fuzzRetryAfter = []string{"", "0", "1", "30", "Thu, 01 Jan 1970 00:00:00 GMT", "junk"}

// FuzzNoSecondKey: whatever the server answers, in whatever order, one
// operation sends one key, on every attempt: the caller's when it gave
// one, else the one NewKey returned the one time it was called. A NewKey
// that returns a new key on every call makes a second key visible.
//
// The input's first byte chooses the caller's key (header, context, both,
// none) and the body (with GetBody, buffered, too large to buffer, none);
// the second the attempts budget; each further byte one answer and its
// Retry-After.
func FuzzNoSecondKey(f *testing.F) {
	f.Add([]byte{0, 7, 15, 16, 17, 19, 2, 0})
	f.Add([]byte{1, 7, 2, 2, 4, 9, 11, 1})
	f.Add([]byte{2, 7, 3, 6, 7, 10, 12, 14, 0})
	f.Add([]byte{3, 7, 17, 19, 18})
	f.Add([]byte{4, 5, 15, 15, 15, 15, 15, 15})
	f.Add([]byte{8, 7, 16, 0})
	f.Add([]byte{12, 7, 17, 2, 0})
	f.Add([]byte{0, 2, 5})
	f.Add([]byte{0, 7, 8})
	f.Add([]byte{0, 7, 2, 20, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		flags, budget, script := data[0], 1+int(data[1]%8), data[2:]
		if len(script) > 16 {
			script = script[:16]
		}
		answers := make([]answer, len(script))
		for i, b := range script {
			answers[i] = fuzzAnswers[int(b)%len(fuzzAnswers)](fuzzRetryAfter[int(b)/len(fuzzAnswers)%len(fuzzRetryAfter)])
		}
		base := &scripted{t: t, answers: answers}
		clock := newFakeClock()
		cfg := testConfig(clock, base)
		var minted atomic.Int32
		cfg.NewKey = func() string { return fmt.Sprintf("minted-%d", minted.Add(1)) }
		cfg.MaxAttempts = budget
		cfg.MaxBufferedBody = 16
		rt, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}

		const small = `{"amount":1}`
		ctx, want := context.Background(), ""
		if flags&2 != 0 {
			ctx, want = WithKey(ctx, "ctx-key"), "ctx-key"
		}
		var (
			body       io.Reader
			sent       string
			replayable = true
		)
		switch flags >> 2 & 3 {
		case 0:
			body, sent = strings.NewReader(small), small // GetBody
		case 1:
			body, sent = struct{ io.Reader }{strings.NewReader(small)}, small // buffered
		case 2:
			sent = strings.Repeat("x", 40) // too large to buffer: sent once
			body, replayable = struct{ io.Reader }{strings.NewReader(sent)}, false
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://example.test/payments", body)
		if flags&1 != 0 {
			req.Header.Set(DefaultHeader, "header-key")
			want = "header-key"
		}
		res, err := rt.RoundTrip(req)

		keys := base.Keys()
		key := oneKey(t, keys)
		switch n := minted.Load(); {
		case want != "" && (key != want || n != 0):
			t.Fatalf("sent %q (NewKey called %d times), want the caller's %q", key, n, want)
		case want == "" && (key != "minted-1" || n != 1):
			t.Fatalf("sent %q, NewKey called %d times; want one key, minted once", key, n)
		}
		if len(keys) > budget || (!replayable && len(keys) != 1) {
			t.Fatalf("%d attempts, budget %d, body replayable %v", len(keys), budget, replayable)
		}
		for i, b := range base.Bodies() {
			if a := answers[min(i, len(answers)-1)]; a.readBody < 0 && b != sent {
				t.Fatalf("attempt %d sent body %q, want %q", i+1, b, sent)
			}
		}
		for i := range keys {
			if a := answers[min(i, len(answers)-1)]; strings.Contains(a.body, "outcome-unknown") {
				if i != len(keys)-1 || !errors.Is(err, ErrOutcomeUnknown) {
					t.Fatalf("attempt %d of %d answered outcome-unknown; the request ended with %v", i+1, len(keys), err)
				}
			}
		}
		var got Result
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			got = Result{Key: e.Key, Attempts: e.Attempts}
		} else {
			defer res.Body.Close()
			got, _ = Info(res)
		}
		if got.Key != key || got.Attempts != len(keys) {
			t.Fatalf("reported key %q after %d attempts; sent %q in %d", got.Key, got.Attempts, key, len(keys))
		}
	})
}
