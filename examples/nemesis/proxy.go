package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// delayProxy forwards TCP connections from a loopback port to the
// database's address in the namespace, holding back every chunk of bytes
// for delay in each direction (so a round trip takes twice that) while
// keeping their order. With delay 0 it only forwards. It stands in for tc
// netem's delay, which this kernel lacks.
type delayProxy struct {
	ln     net.Listener
	target atomic.Pointer[string] // where new connections go
	delay  atomic.Int64           // nanoseconds, each way

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newDelayProxy listens on listen (a loopback address; port 0 picks one)
// and forwards to target.
func newDelayProxy(listen, target string) (*delayProxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &delayProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.retarget(target)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *delayProxy) addr() string { return p.ln.Addr().String() }

func (p *delayProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

// retarget sends new connections to target (a failover); the ones open
// stay where they are.
func (p *delayProxy) retarget(target string) { p.target.Store(&target) }

func (p *delayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *delayProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		if p.conns == nil {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *delayProxy) serve(client net.Conn) {
	defer p.wg.Done()
	// A bounded dial: a partition must not leave the proxy dialling for
	// the kernel's two minutes.
	upstream, err := net.DialTimeout("tcp", *p.target.Load(), 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, true) || !p.track(upstream, true) {
		client.Close()
		upstream.Close()
		return
	}
	var once sync.Once
	done := func() {
		once.Do(func() {
			client.Close()
			upstream.Close()
			p.track(client, false)
			p.track(upstream, false)
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(upstream, client); done() }()
	go func() { defer wg.Done(); p.pump(client, upstream); done() }()
	wg.Wait()
}

type chunk struct {
	due time.Time
	b   []byte
}

// pump copies from src to dst, each chunk written no earlier than its
// arrival plus the delay in force when it arrived.
func (p *delayProxy) pump(dst, src net.Conn) {
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now().Add(time.Duration(p.delay.Load())), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q { // let the reader end
			}
			return
		}
	}
}

// close stops accepting and cuts every connection.
func (p *delayProxy) close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
