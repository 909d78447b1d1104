package idemadapter

import (
	"net/http"

	idem "github.com/idemgo/idem/core"
)

// HTTPRequest returns eng's view of r for principal. Adapters for
// frameworks built on net/http (net/http itself, Gin, Echo) use it so that
// every one of them reads the same headers the same way: the key from every
// field line of Config.Header (see KeyField), so that several are refused as
// ambiguous rather than the first one used. Its Route is
// r.Pattern, the ServeMux pattern that matched ("POST /payments/{id}"),
// empty when no ServeMux has routed r yet; an adapter for a framework with
// its own router sets Route after (see Adapter.Route).
func HTTPRequest(eng *idem.Engine, r *http.Request, principal string) idem.Request {
	cfg := eng.Config()
	return httpRequest(&cfg, r, principal)
}

func httpRequest(cfg *idem.Config, r *http.Request, principal string) idem.Request {
	return idem.Request{
		Method:        r.Method,
		Path:          r.URL.RequestURI(),
		Route:         r.Pattern,
		Principal:     principal,
		Key:           KeyField(r.Header.Values(cfg.Header)),
		ContentType:   r.Header.Get("Content-Type"),
		RequestID:     r.Header.Get(cfg.RequestIDHeader),
		Body:          r.Body,
		ContentLength: r.ContentLength,
	}
}

// HandleHTTP runs one request through eng for adapters built on net/http,
// and writes the final response to w.
//
// next must run the framework's handler chain with r2 as the request and
// buf installed as the response writer, and return the handler's error if
// the framework has one (already rendered into buf, see ResponseBuffer.Reset).
// r2 carries the attempt's context (with the store's transaction and the
// deadline) and the request body restored after the fingerprint read it.
// When the key is optional and absent, next is called with the original r
// and a nil buf: run the handler unbuffered. A panic in next releases the
// key and goes on unchanged to the framework's recovery.
func HandleHTTP(eng *idem.Engine, w http.ResponseWriter, r *http.Request, principal string,
	next func(r2 *http.Request, buf *ResponseBuffer) error) {
	cfg := eng.Config()
	handleHTTP(eng, cfg.MaxResponseBytes, w, r, httpRequest(&cfg, r, principal), next)
}

// handleHTTP is HandleHTTP with the engine's view of r already built.
func handleHTTP(eng *idem.Engine, maxResponse int, w http.ResponseWriter, r *http.Request, req idem.Request,
	next func(r2 *http.Request, buf *ResponseBuffer) error) {
	att, resp := eng.Begin(r.Context(), req)
	if att == nil {
		if resp == nil {
			_ = next(r, nil)
			return
		}
		WriteResponse(w, resp)
		return
	}
	defer att.Abort()
	buf := getBuffer(w.Header(), maxResponse)
	defer putBuffer(buf)
	r2 := r.WithContext(att.Context())
	// The body is what the client sent, so Content-Length stays right.
	buf.reqBody.Reset(att.Body())
	r2.Body = &buf.reqBody
	r2.ContentLength = int64(len(att.Body()))
	err := next(r2, buf)
	// Finish hands the stores the body, and they copy or serialise it;
	// once it is written the buffer can serve another request.
	WriteResponse(w, att.Finish(buf.Result(err)))
}
