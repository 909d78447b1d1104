package idemclient

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkPost measures what the Transport adds to one successful POST
// over a plain http.Client, in process: client=plain is http.Client over
// the base RoundTripper, client=idemclient the same with a Transport in
// between (a new key, a copy of the request and its headers, the answer
// read into memory). rt=memory is a RoundTripper that answers at once,
// which isolates the overhead; rt=loopback a real HTTP round trip to an
// httptest server on 127.0.0.1. Compare the two with
// benchstat -col /client.
func BenchmarkPost(b *testing.B) {
	const reqBody = `{"amount":1250,"currency":"EUR","description":"order 42"}`
	const respBody = `{"id":"pay_6bb46fb6c5c82ab12d127298","amount":1250,"currency":"EUR","status":"succeeded"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, respBody)
	}))
	defer srv.Close()
	bases := []struct {
		name string
		rt   func() http.RoundTripper
	}{
		{"memory", func() http.RoundTripper { return memoryRT(respBody) }},
		{"loopback", func() http.RoundTripper { return &http.Transport{MaxIdleConnsPerHost: 4} }},
	}
	for _, base := range bases {
		for _, client := range []string{"plain", "idemclient"} {
			b.Run("rt="+base.name+"/client="+client, func(b *testing.B) {
				rt := base.rt()
				if t, ok := rt.(*http.Transport); ok {
					defer t.CloseIdleConnections()
				}
				if client == "idemclient" {
					var err error
					if rt, err = New(Config{Base: rt}); err != nil {
						b.Fatal(err)
					}
				}
				c := &http.Client{Transport: rt}
				b.ReportAllocs()
				for b.Loop() {
					req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(reqBody))
					req.Header.Set("Content-Type", "application/json")
					resp, err := c.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := io.Copy(io.Discard, resp.Body); err != nil {
						b.Fatal(err)
					}
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						b.Fatal(resp.Status)
					}
				}
			})
		}
	}
}

// memoryRT answers every request with a 201 and body, without a network.
type memoryRT string

func (m memoryRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		Status: "201 Created", StatusCode: http.StatusCreated, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(string(m))),
		ContentLength: int64(len(m)), Request: r,
	}, nil
}
