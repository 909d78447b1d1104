package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// oneByteThenFail is a client that declared a large body, sent one byte
// and then broke off.
type oneByteThenFail struct{ sent bool }

func (r *oneByteThenFail) Read(p []byte) (int, error) {
	if !r.sent && len(p) > 0 {
		r.sent = true
		p[0] = '{'
		return 1, nil
	}
	return 0, io.ErrUnexpectedEOF
}

// TestBodyBufferIgnoresDeclaredLength: the body buffer grows with what
// arrives, never from the declared Content-Length. A request declaring 1 MiB
// that sends 1 byte allocates a few KiB, not 1 MiB.
func TestBodyBufferIgnoresDeclaredLength(t *testing.T) {
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), MaxBodyBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		req := request("alice", fmt.Sprintf("k%d", i))
		req.Body, req.ContentLength = &oneByteThenFail{}, 1<<20
		att, resp := e.Begin(context.Background(), req)
		if att != nil || resp == nil || resp.Status != http.StatusBadRequest {
			t.Fatalf("want a 400 body-unreadable, got attempt %v response %+v", att, resp)
		}
	}
	runtime.ReadMemStats(&after)
	perRequest := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("allocated %d bytes per request declaring 1 MiB and sending 1 byte", perRequest)
	if perRequest > 64<<10 {
		t.Fatalf("allocated %d bytes per request: the buffer was sized from the declared length", perRequest)
	}
}

// TestSlowBodyFloodHeap: many connections each declaring a 1 MiB body and
// sending 1 byte, held open against a real server, cost the heap little:
// a body is not allocated from its declared length.
func TestSlowBodyFloodHeap(t *testing.T) {
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), MaxBodyBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var reading atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reading.Add(1)
		idemadapter.HandleHTTP(e, w, r, "alice", func(*http.Request, *idemadapter.ResponseBuffer) error { return nil })
	}))
	defer srv.Close()

	const conns = 400
	heapBefore := heapInUse()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		open = append(open, c)
		fmt.Fprintf(c, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", i, 1<<20)
	}
	deadline := time.Now().Add(20 * time.Second)
	for reading.Load() < conns {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the handler", reading.Load(), conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // every handler is now blocked in the body read
	grown := int64(heapInUse()) - int64(heapBefore)
	t.Logf("%d connections declaring 1 MiB and sending 1 byte: heap grew by %.1f MB", conns, float64(grown)/1e6)
	if grown > 64<<20 {
		t.Fatalf("heap grew by %d bytes: bodies are allocated from their declared length", grown)
	}
}

// TestRequestIDFloodHeap: 300 requests with a 933 KB request id, each
// claimed and completed in memstore, leave the store holding ids of at most
// MaxRequestIDLength bytes, and a heap that grows by at most 32 MB.
func TestRequestIDFloodHeap(t *testing.T) {
	store := memstore.MustNew()
	logged := &syncBuffer{}
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: store, Logger: slog.New(slog.NewTextHandler(logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idemadapter.HandleHTTP(e, w, r, "alice", func(_ *http.Request, b *idemadapter.ResponseBuffer) error {
			b.WriteHeader(http.StatusCreated)
			return nil
		})
	}))
	defer srv.Close()
	id := strings.Repeat("r", 933_000)
	heapBefore := heapInUse()
	for i := range 300 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("k%d", i))
		req.Header.Set("X-Request-Id", id)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	srv.CloseClientConnections()
	grown := int64(heapInUse()) - int64(heapBefore)
	t.Logf("300 requests with a 933 KB request id: heap grew by %.1f MB, %d records", float64(grown)/1e6, store.Len())
	rec, err := store.Get(context.Background(), "alice", "k0")
	if err != nil && !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatal(err)
	}
	if len(rec.RequestID) > idemstore.MaxRequestIDLength {
		t.Fatalf("stored request id is %d bytes", len(rec.RequestID))
	}
	// The warning for a handler that never used the transaction logs the
	// request id too: bounded like the stored one.
	if n, lines := logged.len(); !logged.contains("request_id=") || n > lines*(idemstore.MaxRequestIDLength+1024) {
		t.Fatalf("%d log lines of %d bytes, want each with a request id bounded to %d bytes", lines, n, idemstore.MaxRequestIDLength)
	}
	if grown > 32<<20 {
		t.Fatalf("heap grew by %d bytes", grown)
	}
}

// syncBuffer is a log destination safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) len() (n, lines int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len(), bytes.Count(b.b.Bytes(), []byte("\n"))
}

func (b *syncBuffer) contains(s string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Contains(b.b.Bytes(), []byte(s))
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
