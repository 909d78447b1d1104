package idemclient

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// body is a request's body as the retry loop sees it: what the first
// attempt sends, and how a later attempt gets the same bytes again, if it
// can.
type body struct {
	first         io.ReadCloser
	getBody       func() (io.ReadCloser, error) // nil: no body (every attempt sends first), or one that cannot be sent again
	contentLength int64
	replayable    bool
}

// prepareBody decides how req's body is resent. A nil or empty body and a
// body with GetBody are resent as they are; another body is read into
// memory when it is at most limit bytes (a negative limit buffers nothing).
// A larger one is sent once, never again: its bytes cannot be produced a
// second time. On error, req.Body has been closed.
func prepareBody(req *http.Request, limit int64) (body, error) {
	b := body{first: req.Body, getBody: req.GetBody, contentLength: req.ContentLength}
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b.replayable = true
		return b, nil
	case req.GetBody != nil:
		b.replayable = true
		return b, nil
	case limit < 0 || req.ContentLength > limit:
		return b, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		_ = req.Body.Close()
		return body{}, fmt.Errorf("idemclient: reading the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to keep: send what was read, then the rest, once.
		b.first = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
		return b, nil
	}
	_ = req.Body.Close()
	if req.ContentLength > 0 && int64(len(buf)) != req.ContentLength {
		return body{}, fmt.Errorf("idemclient: the request body has %d bytes, its ContentLength says %d", len(buf), req.ContentLength)
	}
	if req.ContentLength <= 0 {
		b.contentLength = int64(len(buf))
	}
	if len(buf) == 0 && b.contentLength == 0 {
		b.first, b.getBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
	} else {
		b.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		b.first, _ = b.getBody()
	}
	b.replayable = true
	return b, nil
}
