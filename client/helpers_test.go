package idemclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is Config.Now and Config.Sleep for tests: Sleep records the
// wait and moves the clock on, without sleeping.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// onSleep, when set, runs before each recorded wait (to cancel a
	// context in the middle of one).
	onSleep func()
}

// newFakeClock starts at the current second (Retry-After dates have no
// fraction).
func newFakeClock() *fakeClock { return &fakeClock{now: time.Now().Truncate(time.Second)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.onSleep != nil {
		c.onSleep()
	}
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// testConfig is a Config with the fake clock and a jitter that always
// draws the ceiling, so that every wait is known.
func testConfig(clock *fakeClock, base http.RoundTripper) Config {
	return Config{
		Base:   base,
		Now:    clock.Now,
		Sleep:  clock.Sleep,
		Jitter: func(ceiling time.Duration) time.Duration { return ceiling },
	}
}

// answer is one scripted reply of a server: a response, or a transport
// error (err) after reading readBody bytes of the request body (-1: all).
type answer struct {
	status   int
	header   http.Header
	body     string
	err      error
	readBody int
	// hook runs when the answer is given (to cancel a context).
	hook func()
	// truncated, when positive, is the Content-Length announced for a
	// body that breaks off after body: the connection was cut in the
	// middle of the answer.
	truncated int
}

func resp(status int, kv ...string) answer {
	a := answer{status: status, header: http.Header{}, readBody: -1}
	for i := 0; i+1 < len(kv); i += 2 {
		a.header.Set(kv[i], kv[i+1])
	}
	return a
}

// problem is an RFC 9457 answer of the given type; an anchor without a
// scheme is one of idem's (docs/problems.md#anchor).
func problem(status int, typ string, kv ...string) answer {
	a := resp(status, kv...)
	if !strings.Contains(typ, "://") {
		typ = problemBase + typ
	}
	a.header.Set("Content-Type", "application/problem+json")
	b, _ := json.Marshal(map[string]any{"type": typ, "title": "t", "status": status})
	a.body = string(b)
	return a
}

func replayed(a answer) answer {
	a.header.Set(ReplayedHeader, "true")
	return a
}

func cut(readBody int) answer {
	return answer{err: errors.New("scripted: connection reset by peer"), readBody: readBody}
}

// scripted is an in-memory RoundTripper that gives its answers in order
// (the last one again when they run out) and records what each attempt
// sent.
type scripted struct {
	t       testing.TB
	header  string
	answers []answer

	mu     sync.Mutex
	keys   [][]string // the key header's values, per attempt
	bodies []string   // the body bytes read, per attempt
}

func (s *scripted) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	n := len(s.keys)
	a := s.answers[min(n, len(s.answers)-1)]
	name := s.header
	if name == "" {
		name = DefaultHeader
	}
	s.keys = append(s.keys, r.Header.Values(name))
	s.mu.Unlock()
	var got []byte
	if r.Body != nil {
		if a.readBody >= 0 {
			got, _ = io.ReadAll(io.LimitReader(r.Body, int64(a.readBody)))
		} else {
			got, _ = io.ReadAll(r.Body)
		}
		_ = r.Body.Close()
	}
	s.mu.Lock()
	s.bodies = append(s.bodies, string(got))
	s.mu.Unlock()
	if a.hook != nil {
		a.hook()
	}
	if a.err != nil {
		return nil, a.err
	}
	h := a.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	var rd io.Reader = strings.NewReader(a.body)
	length := int64(len(a.body))
	if a.truncated > 0 {
		rd, length = io.MultiReader(rd, errReader{io.ErrUnexpectedEOF}), int64(a.truncated)
	}
	return &http.Response{
		Status: http.StatusText(a.status), StatusCode: a.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(rd), ContentLength: length, Request: r,
	}, nil
}

func (s *scripted) Keys() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]string(nil), s.keys...)
}

func (s *scripted) Bodies() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// oneKey fails unless every attempt sent exactly one key value and all of
// them the same; it returns that key.
func oneKey(t testing.TB, keys [][]string) string {
	t.Helper()
	if len(keys) == 0 {
		t.Fatal("no attempt was sent")
	}
	for i, k := range keys {
		if len(k) != 1 || k[0] == "" {
			t.Fatalf("attempt %d sent key values %q, want exactly one", i+1, k)
		}
		if k[0] != keys[0][0] {
			t.Fatalf("attempt %d sent key %q, attempt 1 sent %q: two keys for one operation", i+1, k[0], keys[0][0])
		}
	}
	return keys[0][0]
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
