// Package faultproxy is a TCP proxy for tests that cuts the connections
// between an application and its database at a chosen moment: now, or when
// a byte pattern (a statement's text) passes from the client to the server,
// before or after forwarding it. Cutting after forwarding a COMMIT is the
// ambiguous case: the server may have committed while the client only sees
// a broken connection.
//
// It listens on 127.0.0.1 only.
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// When says whether a triggered cut happens before or after the matching
// bytes are forwarded to the server.
type When int

const (
	// Before cuts without forwarding the matching chunk: the server never
	// sees the statement.
	Before When = iota
	// After forwards the matching chunk and cuts when the server answers
	// it, before the answer reaches the client: by the time the client
	// sees the connection end, the server has run the statement.
	After
)

// Proxy forwards TCP connections from its listener to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[*link]struct{}
	trigger *trigger

	cuts atomic.Int64
	wg   sync.WaitGroup
}

type trigger struct {
	pattern []byte
	when    When
	fired   chan struct{}
}

type link struct {
	client, server net.Conn
	once           sync.Once
	// cutting is set when a chunk was forwarded to be cut After: the
	// server's next bytes are its answer, which ends the link instead.
	cutting atomic.Bool
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// New starts a proxy on 127.0.0.1 forwarding to target ("host:port").
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cuts returns how many connections the proxy has cut.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

// CutAll closes every open connection now.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.cut(l)
	}
}

// cut closes l on purpose and counts it.
func (p *Proxy) cut(l *link) {
	if p.drop(l) {
		p.cuts.Add(1)
	}
	l.close()
}

// end closes l because one side closed it; it is not counted as a cut.
func (p *Proxy) end(l *link) {
	p.drop(l)
	l.close()
}

func (p *Proxy) drop(l *link) (wasOpen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, wasOpen = p.conns[l]
	delete(p.conns, l)
	return wasOpen
}

// CutOn arms a one-shot trigger: the first connection whose client sends a
// chunk containing pattern is cut, before or after the chunk is forwarded.
// The returned channel is closed when the cut happened. A new CutOn
// replaces an armed trigger.
func (p *Proxy) CutOn(pattern []byte, when When) <-chan struct{} {
	t := &trigger{pattern: bytes.Clone(pattern), when: when, fired: make(chan struct{})}
	p.mu.Lock()
	p.trigger = t
	p.mu.Unlock()
	return t.fired
}

// CutWhile arms a cut on pattern at when, runs fn, and reports whether the
// cut fired within wait after fn returned. When it did not, the cut is
// disarmed, so it cannot fire later on another statement.
func (p *Proxy) CutWhile(pattern []byte, when When, wait time.Duration, fn func()) bool {
	fired := p.CutOn(pattern, when)
	fn()
	select {
	case <-fired:
		return true
	case <-time.After(wait):
		p.Disarm()
		return false
	}
}

// Disarm removes an armed trigger that has not fired.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	p.trigger = nil
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.upstream(l)
		go p.downstream(l)
	}
}

// upstream copies client → server chunk by chunk, checking each chunk
// against the armed trigger. A pattern split across two reads is not
// seen; the statements tests match on are sent in one write.
func (p *Proxy) upstream(l *link) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			// fired is closed before the cut, so a caller that sees the
			// cut's error also sees that the trigger fired.
			t := p.take(chunk)
			if t != nil && t.when == Before {
				close(t.fired)
				p.cut(l)
				return
			}
			if t != nil {
				// After: forward the chunk and let the copy back end the
				// link when the server answers it (downstream), so that
				// the client sees the cut only once the statement has run:
				// a client that resends on another connection cannot
				// overtake it. No byte of the answer reaches the client.
				close(t.fired)
				if p.drop(l) {
					p.cuts.Add(1)
				}
				l.cutting.Store(true)
				if _, werr := l.server.Write(chunk); werr != nil {
					l.close()
					return
				}
				// Half-close: the server reads the chunk whole and
				// answers it before it sees the end of the stream.
				// Closing outright with an answer unread resets the
				// connection, and the server could drop the chunk unread.
				if tc, ok := l.server.(*net.TCPConn); ok && tc.CloseWrite() == nil {
					_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
					return
				}
				l.close()
				return
			}
			if _, werr := l.server.Write(chunk); werr != nil {
				p.end(l)
				return
			}
		}
		if err != nil {
			p.end(l)
			return
		}
	}
}

// downstream copies server → client until either side ends, or until the
// server answers a chunk forwarded to be cut After.
func (p *Proxy) downstream(l *link) {
	defer p.wg.Done()
	defer p.end(l)
	buf := make([]byte, 64<<10)
	for {
		n, err := l.server.Read(buf)
		if l.cutting.Load() {
			return
		}
		if n > 0 {
			if _, werr := l.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// take returns the armed trigger and disarms it if chunk matches it.
func (p *Proxy) take(chunk []byte) *trigger {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trigger
	if t == nil || !bytes.Contains(chunk, t.pattern) {
		return nil
	}
	p.trigger = nil
	return t
}
