package faultproxy_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/core/storetest/faultproxy"
)

// server records every line it receives and echoes it back; it takes
// 50 ms over a COMMIT, as a loaded database may.
func server(t *testing.T) (addr string, lines chan string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines = make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "COMMIT") {
						time.Sleep(50 * time.Millisecond)
					}
					lines <- strings.TrimSpace(line)
					_, _ = c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string) (string, error) {
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestCutBeforeAndAfter(t *testing.T) {
	for _, tc := range []struct {
		when       faultproxy.When
		serverSees bool
	}{{faultproxy.Before, false}, {faultproxy.After, true}} {
		addr, lines := server(t)
		p, err := faultproxy.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		if got, err := roundTrip(c, r, "BEGIN"); err != nil || got != "BEGIN" {
			t.Fatalf("forwarding: %q %v", got, err)
		}
		<-lines
		fired := p.CutOn([]byte("COMMIT"), tc.when)
		if got, err := roundTrip(c, r, "COMMIT"); err == nil {
			t.Fatalf("when=%d: the client got %q through a cut connection", tc.when, got)
		}
		<-fired
		if tc.serverSees {
			// The server had the statement before the client saw the cut.
			select {
			case <-lines:
			default:
				t.Fatal("when=After: the client saw the cut before the server had the statement")
			}
		} else {
			select {
			case l := <-lines:
				t.Fatalf("when=Before: the server saw %q", l)
			case <-time.After(300 * time.Millisecond):
			}
		}
		if p.Cuts() != 1 {
			t.Fatalf("cuts = %d", p.Cuts())
		}
		// New connections still work after a cut.
		c2, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := roundTrip(c2, bufio.NewReader(c2), "AGAIN"); err != nil || got != "AGAIN" {
			t.Fatalf("after a cut: %q %v", got, err)
		}
		c.Close()
		c2.Close()
		p.Close()
	}
}
