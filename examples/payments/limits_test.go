package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
)

// TestHTTPServerLimits: the example's net/http server (net/http, Gin,
// Echo) bounds every phase of a connection, and its write bound leaves
// room for the handler's deadline and the commit.
func TestHTTPServerLimits(t *testing.T) {
	cfg := idem.Config{FingerprintKey: storetest.FingerprintKey, RequestTimeout: 30 * time.Second, StoreTimeout: 5 * time.Second}
	s := newHTTPServer(http.NotFoundHandler(), cfg).s
	for _, tc := range []struct {
		name string
		got  time.Duration
	}{
		{"ReadHeaderTimeout", s.ReadHeaderTimeout},
		{"ReadTimeout", s.ReadTimeout},
		{"WriteTimeout", s.WriteTimeout},
		{"IdleTimeout", s.IdleTimeout},
	} {
		if tc.got <= 0 {
			t.Errorf("%s is not set", tc.name)
		}
	}
	if s.MaxHeaderBytes <= 0 || s.MaxHeaderBytes > 1<<20 {
		t.Errorf("MaxHeaderBytes = %d", s.MaxHeaderBytes)
	}
	if min := s.ReadTimeout + cfg.RequestTimeout + cfg.StoreTimeout; s.WriteTimeout <= min {
		t.Errorf("WriteTimeout %v does not cover reading, the handler and the commit (%v)", s.WriteTimeout, min)
	}
}

// TestSlowBodyIsCut: a client that declares a body and sends one byte is
// cut by the server's read timeout instead of holding the connection. The
// server is the example's as built, with its ReadTimeout shortened to keep
// the test short.
func TestSlowBodyIsCut(t *testing.T) {
	read := make(chan error, 1)
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		read <- err
	}), idem.Config{})
	srv.s.ReadTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.s.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "POST /payments HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", 1<<20)
	select {
	case err := <-read:
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("body read ended with %v, want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the slow body was not cut within 5s")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("connection not closed by the server: %v", err)
	}
	t.Logf("slow body cut after %v", time.Since(start).Round(time.Millisecond))
}
