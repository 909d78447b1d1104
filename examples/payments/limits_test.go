package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
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

// TestSlowBodyFlood: 400 connections that each declare a 1 MiB body and
// send one byte hold at most 128 MB of the example's memory, on every
// framework, until the read timeout cuts them (a race-detector build needs
// several times a plain one's memory per connection). It reads the
// process's resident set from /proc. Fiber without StreamRequestBody grew
// by 407 MB here; with it 28 MB, and net/http (Gin) 60 MB, under -race.
func TestSlowBodyFlood(t *testing.T) {
	const conns, limitMB = 400, 128
	for _, fw := range []string{"fiber", "gin"} {
		t.Run(fw, func(t *testing.T) {
			p := startService(t, "-framework", fw, "-store", "memory")
			addr := strings.TrimPrefix(p.base, "http://")
			before := rssMB(t, p.cmd.Process.Pid)
			for i := range conns {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				fmt.Fprintf(c, "POST /payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acct-flood\r\n"+
					"Idempotency-Key: flood-%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", i, 1<<20)
			}
			time.Sleep(time.Second) // every connection's headers read, its body awaited
			grew := rssMB(t, p.cmd.Process.Pid) - before
			t.Logf("%s: %d slow bodies of a declared 1 MiB: resident set grew by %d MB", fw, conns, grew)
			if grew > limitMB {
				t.Fatalf("%d slow bodies grew the process by %d MB, want at most %d: the declared length was allocated", conns, grew, limitMB)
			}
		})
	}
}

// rssMB reads a process's resident set size, in MiB, from /proc.
func rssMB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")))
			if err != nil {
				t.Fatalf("VmRSS %q: %v", line, err)
			}
			return n / 1024
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}
