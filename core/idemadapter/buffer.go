package idemadapter

import (
	"bytes"
	"net/http"
	"sync"

	idem "github.com/idemgo/idem/core"
)

// ResponseBuffer is an http.ResponseWriter that holds the whole response in
// memory, so nothing reaches the client before the outcome is committed.
// Adapters on net/http-based frameworks install it in place of the real
// writer while the handler runs.
//
// Its header map is a copy of the real writer's, so headers set by earlier
// middleware (CORS, request ids) are kept. Flush does nothing: a handler
// cannot push bytes past the commit. It keeps at most limit+1 body bytes
// and counts the rest, so a huge response costs bounded memory and is
// reported as Overflow.
type ResponseBuffer struct {
	header      http.Header
	status      int
	body        bytes.Buffer
	size        int
	limit       int
	wroteHeader bool
	flushed     bool         // the handler asked to flush: it meant to stream
	reqBody     restoredBody // the request body handed back to the handler (HandleHTTP)
}

// restoredBody hands the handler the body Begin read, without allocating.
type restoredBody struct{ bytes.Reader }

func (restoredBody) Close() error { return nil }

// NewResponseBuffer returns a buffer whose header map is a clone of header
// and that keeps at most limit body bytes.
func NewResponseBuffer(header http.Header, limit int) *ResponseBuffer {
	return &ResponseBuffer{header: header.Clone(), limit: limit}
}

// buffers pools the buffers ServeHTTP uses. The pool saves 4 allocations per
// first request, 2 of them the reused header map; both are measured against
// NewResponseBuffer per request in docs/design-notes.md, "The engine's hot
// path".
var buffers = sync.Pool{New: func() any { return new(ResponseBuffer) }}

// maxPooledBody keeps the buffers of large responses out of the pool.
const maxPooledBody = 64 << 10

// maxPooledHeader keeps the header maps of unusual responses out of the
// pool: a map does not shrink when it is cleared.
const maxPooledHeader = 32

// getBuffer returns a pooled buffer holding a copy of header. The pooled
// header map is reused (it was cleared when put back), so a request whose
// writer has no headers set yet, the common case, allocates no map.
func getBuffer(header http.Header, limit int) *ResponseBuffer {
	b := buffers.Get().(*ResponseBuffer)
	b.limit = limit
	if b.header == nil {
		b.header = make(http.Header, len(header))
	}
	if len(header) > 0 {
		// As http.Header.Clone: one backing array for all the values.
		n := 0
		for _, v := range header {
			n += len(v)
		}
		values := make([]string, n)
		for k, v := range header {
			n := copy(values, v)
			b.header[k] = values[:n:n]
			values = values[n:]
		}
	}
	return b
}

// putBuffer returns b to the pool. Whatever the last response's header map
// handed out (WriteResponse copies its entries, stores copy what they keep)
// holds the value slices, which are never written again: clearing the map
// only drops its references.
func putBuffer(b *ResponseBuffer) {
	if b.body.Cap() > maxPooledBody {
		return
	}
	b.Reset()
	b.reqBody.Reset(nil) // the pool keeps no request body alive
	if len(b.header) > maxPooledHeader {
		b.header = nil
	} else {
		clear(b.header)
	}
	buffers.Put(b)
}

// Header returns the buffered header map.
func (b *ResponseBuffer) Header() http.Header {
	if b.header == nil {
		b.header = make(http.Header)
	}
	return b.header
}

// WriteHeader records the status; the first final status wins, and 1xx
// informational statuses are ignored.
func (b *ResponseBuffer) WriteHeader(code int) {
	if b.wroteHeader || code < 200 {
		return
	}
	b.status, b.wroteHeader = code, true
}

// Write buffers p, implying status 200 if none was written.
func (b *ResponseBuffer) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	b.size += len(p)
	if room := b.limit + 1 - b.body.Len(); room > 0 {
		b.body.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// WriteString buffers s.
func (b *ResponseBuffer) WriteString(s string) (int, error) {
	b.WriteHeader(http.StatusOK)
	b.size += len(s)
	if room := b.limit + 1 - b.body.Len(); room > 0 {
		b.body.WriteString(s[:min(room, len(s))])
	}
	return len(s), nil
}

// Flush does nothing: the response is sent only after the commit. Frameworks
// call Flush on their own (gin's c.Stream, echo's Response.Flush), so it
// must not fail; handlers that flush through http.ResponseController get
// ErrStreaming from FlushError instead. Either way the Result says the
// handler meant to stream (Result.Streamed), and the engine logs once that
// streaming on an idempotent route sends the response whole, after the
// handler.
func (b *ResponseBuffer) Flush() { b.flushed = true }

// FlushError refuses to stream with ErrStreaming; http.ResponseController
// calls it.
func (b *ResponseBuffer) FlushError() error {
	b.flushed = true
	return ErrStreaming
}

// Status returns the recorded status, or 0 if nothing was written.
func (b *ResponseBuffer) Status() int { return b.status }

// Written reports whether a status or body was written.
func (b *ResponseBuffer) Written() bool { return b.wroteHeader }

// Size returns the number of body bytes written, including any past the
// limit.
func (b *ResponseBuffer) Size() int { return b.size }

// Reset discards everything written, keeping the header map's pre-set
// entries untouched. Adapters call it before a framework's error handler
// renders a returned error, so the error response replaces a partial one.
func (b *ResponseBuffer) Reset() {
	b.status, b.wroteHeader, b.size, b.flushed = 0, false, 0, false
	b.body.Reset()
}

// Result returns what was buffered as a Result, with err as the handler's
// error.
func (b *ResponseBuffer) Result(err error) idem.Result {
	status := b.status
	if status == 0 {
		status = http.StatusOK
	}
	return idem.Result{
		Status:   status,
		Header:   b.header,
		Body:     b.body.Bytes(),
		Err:      err,
		Overflow: b.size > b.limit,
		Streamed: b.flushed,
	}
}
