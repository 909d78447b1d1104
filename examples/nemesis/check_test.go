package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const (
	bodyA = `{"id":"pay_a","amount":100}`
	bodyB = `{"id":"pay_b","amount":100}`
)

func created(body string) answer { return answer{201, body} }

// good is a history and end state that every check passes: a key answered
// 201 and confirmed, a key whose fresh 201 was lost (only replays seen), an
// orphan whose record completed, and a key never resolved.
func good() ([]*keyHistory, dbState) {
	hs := []*keyHistory{
		{account: "a", key: "ka", answers: []answer{created(bodyA), created(bodyA)}, fresh: 1},
		{account: "b", key: "kb", answers: []answer{created(bodyB), created(bodyB)}},
		{account: "c", key: "kc", unknown: true},
		{account: "d", key: "kd"},
	}
	db := dbState{
		payments: map[string][]string{"a": {"pay_a"}, "b": {"pay_b"}, "c": {"pay_c"}},
		records:  map[string]string{"a": "completed", "b": "completed", "c": "completed", "d": "in_progress"},
		charges:  map[string]int{"a": 1, "b": 1, "c": 1},
	}
	return hs, db
}

func TestCheckPassesAGoodHistory(t *testing.T) {
	hs, db := good()
	r := check(hs, db)
	if r.failed() || r.keys != 4 || r.got201 != 2 || r.fresh201 != 1 || r.orphans != 1 || r.orphansReplayable != 1 ||
		r.unresolved != 2 || r.unknown != 1 {
		t.Fatalf("%+v", r)
	}
}

// TestCheckCatches: each broken promise, made into the good history, fails
// the check under its own count.
func TestCheckCatches(t *testing.T) {
	for _, c := range []struct {
		name   string
		break_ func([]*keyHistory, *dbState)
		count  func(report) int
	}{
		{"a second payment for a key", func(_ []*keyHistory, db *dbState) { db.payments["a"] = append(db.payments["a"], "pay_a2") },
			func(r report) int { return r.duplicates }},
		{"a replay that differs", func(hs []*keyHistory, _ *dbState) { hs[0].answers[1] = created(`{"id":"pay_a","amount":101}`) },
			func(r report) int { return r.divergent }},
		{"a 201 and then a 422", func(hs []*keyHistory, _ *dbState) { hs[1].answers[1] = answer{422, "key-reused"} },
			func(r report) int { return r.divergent }},
		{"a 201 without its payment", func(_ []*keyHistory, db *dbState) { delete(db.payments, "b") },
			func(r report) int { return r.lost }},
		{"a 201 naming another payment", func(_ []*keyHistory, db *dbState) { db.payments["b"] = []string{"pay_x"} },
			func(r report) int { return r.mismatched }},
		{"a key charged twice", func(_ []*keyHistory, db *dbState) { db.charges["c"] = 2 },
			func(r report) int { return r.charged }},
		{"a payment no client asked for", func(_ []*keyHistory, db *dbState) { db.payments["zz"] = []string{"pay_z"} },
			func(r report) int { return r.strays }},
	} {
		t.Run(c.name, func(t *testing.T) {
			hs, db := good()
			c.break_(hs, &db)
			r := check(hs, db)
			if !r.failed() || c.count(r) != 1 || len(r.examples) != 1 {
				t.Fatalf("%+v: want failed, the count 1 and one example", r)
			}
			if !strings.Contains(r.summary("pgx", nil, 0), "nemesis FAIL ") {
				t.Fatal(r.summary("pgx", nil, 0))
			}
		})
	}
}

// TestSubnetForStaysInRange: every pid maps to a /30 of 10.213.0.0/16.
func TestSubnetForStaysInRange(t *testing.T) {
	whole := netip.MustParsePrefix("10.213.0.0/16")
	for _, pid := range []int{1, 63, 64, 4194303, 15999, 16000} {
		p := subnetFor(pid)
		if p.Bits() != 30 || !whole.Contains(p.Addr()) || p.Masked() != p {
			t.Errorf("pid %d: %v", pid, p)
		}
	}
}

// TestRouteVerdict: a fault is applied only when the database's address
// is reached through the veth or refused, never by a gateway or another
// interface.
func TestRouteVerdict(t *testing.T) {
	failed := errors.New("exit status 2")
	for _, c := range []struct {
		out  string
		err  error
		safe bool
	}{
		{"10.213.7.2 dev nmh42 src 10.213.7.1 uid 0 \n    cache \n", nil, true},
		{"RTNETLINK answers: No route to host\n", failed, true},
		{"unreachable 10.213.7.2 table main proto 213 metric 4242\n", nil, true},
		{"10.213.7.2 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \n    cache \n", nil, false},
		{"10.213.7.2 dev eth0 src 192.0.2.2 uid 0 \n", nil, false},
		{"10.213.7.2 dev nmh421 src 10.213.7.1 uid 0 \n", nil, false},
		{"Error: any other failure\n", failed, false},
		{"10.213.7.2 table main\n", nil, false},
	} {
		err := routeVerdict("10.213.7.2", "nmh42", c.out, c.err)
		if (err == nil) != c.safe {
			t.Errorf("%q, %v: %v, want safe=%v", c.out, c.err, err, c.safe)
		}
	}
}

// TestDelayProxyDelaysEachWay: a round trip through the proxy takes twice
// its delay, and none without.
func TestDelayProxyDelaysEachWay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo
				defer c.Close()
				b := make([]byte, 16)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					_, _ = c.Write(b[:n])
				}
			}()
		}
	}()
	p, err := newDelayProxy("127.0.0.1:0", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rtt := func() time.Duration {
		start := time.Now()
		b := make([]byte, 1)
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(b); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := rtt(); d > 50*time.Millisecond {
		t.Fatalf("round trip without delay took %v", d)
	}
	p.setDelay(100 * time.Millisecond)
	if d := rtt(); d < 200*time.Millisecond || d > 400*time.Millisecond {
		t.Fatalf("round trip with 100ms each way took %v, want about 200ms", d)
	}
}

// TestCleanupRunsEveryStepOnceLastFirst: the clean-up undoes in reverse,
// goes on after a failed step, and a second run does nothing.
func TestCleanupRunsEveryStepOnceLastFirst(t *testing.T) {
	var got []string
	cl := &cleanup{}
	cl.add("a", func() error { got = append(got, "a"); return nil })
	child := newCleanup(cl)
	cl.add("b", func() error { got = append(got, "b"); return fmt.Errorf("b failed") })
	child.add("c", func() error { got = append(got, "c"); return nil })
	err := cl.run()
	if err == nil || !strings.Contains(err.Error(), "b failed") || strings.Join(got, "") != "bca" {
		t.Fatalf("%v, ran %v; want b, c, a and b's error", err, got)
	}
	if err := cl.run(); err != nil || len(got) != 3 {
		t.Fatalf("second run: %v, ran %v", err, got)
	}
}

// Example_check: the summary line of a history that kept every promise.
func Example_check() {
	hs := []*keyHistory{{account: "a", key: "k", answers: []answer{created(bodyA), created(bodyA)}, fresh: 1, took: 1500 * time.Millisecond}}
	r := check(hs, dbState{payments: map[string][]string{"a": {"pay_a"}}, records: map[string]string{"a": "completed"}})
	fmt.Println(r.summary("pgx", []string{"db-crash:1"}, 2))
	// Output:
	// nemesis PASS store=pgx keys=1 201=1 fresh201=1 duplicates=0 divergent=0 lost=0 mismatched=0 charged-twice=0 strays=0 orphans=0 (replayable 0) unresolved=0 (outcome-unknown 0) longest=1.5s requests=2 faults=db-crash:1
}
