package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"
)

// nemesis applies the fault schedule: each fault in turn, a quiet gap
// between two, every fault undone before the next one starts.
type nemesis struct {
	db        database // the primary
	replica   *cluster // a streaming replica of it, until a failover promotes it
	cl        *cleanup
	ns        *netns
	instances []*instance
	proxies   []*delayProxy
	o         options

	mu      sync.Mutex
	applied map[string]int
	order   []string
	errors  int
}

// schedule runs until ctx ends; a fault under way when it ends is cut
// short and undone.
func (n *nemesis) schedule(ctx context.Context) {
	for i := 0; ; i++ {
		sleep(ctx, n.o.gap)
		if ctx.Err() != nil {
			return
		}
		f := n.o.faults[i%len(n.o.faults)]
		if f == "failover" && n.replica == nil {
			continue // promoted already: one failover per round
		}
		start := time.Now()
		err := n.apply(ctx, f, i)
		n.mu.Lock()
		if n.applied == nil {
			n.applied = map[string]int{}
		}
		if n.applied[f] == 0 {
			n.order = append(n.order, f)
		}
		n.applied[f]++
		if err != nil {
			n.errors++
		}
		n.mu.Unlock()
		if err != nil {
			log.Printf("fault %s: %v", f, err)
		} else {
			log.Printf("fault %s done in %v", f, time.Since(start).Round(time.Millisecond))
		}
	}
}

// apply injects fault f and undoes it. The undoing never depends on ctx:
// a fault cut short by the end of the load is still healed.
func (n *nemesis) apply(ctx context.Context, f string, i int) error {
	bg := context.Background()
	switch f {
	case "db-crash":
		if err := n.db.crash(bg); err != nil {
			return err
		}
		sleep(ctx, time.Second)
		return n.db.start(bg)
	case "kill":
		in := n.instances[i%len(n.instances)]
		in.kill()
		sleep(ctx, time.Second)
		return in.startRetrying(bg, 60*time.Second)
	case "partition", "loss":
		p, d := 1.0, n.o.partition
		if f == "loss" {
			p, d = n.o.loss, n.o.hold
		}
		err := n.ns.drop(bg, p)
		if err == nil {
			sleep(ctx, d)
		}
		return errors.Join(err, n.ns.heal(bg))
	case "latency":
		p := n.proxies[i%len(n.proxies)]
		p.setDelay(n.o.latency)
		sleep(ctx, n.o.hold)
		p.setDelay(0)
		return nil
	case "link-down":
		return n.ns.linkDown(ctx, n.o.hold)
	case "failover":
		return n.failover(bg)
	}
	return fmt.Errorf("unknown fault %q", f)
}

// failover crashes the primary, promotes the replica and points every
// instance's proxy at it: connections open to the old primary are dead,
// new ones reach the new primary. The old primary stays down. Without a
// replica (none asked for, or already promoted) it does nothing.
func (n *nemesis) failover(ctx context.Context) error {
	if n.replica == nil {
		return nil
	}
	if err := n.db.crash(ctx); err != nil {
		return err
	}
	r := n.replica
	if err := r.promote(ctx); err != nil {
		return err
	}
	n.db, n.replica = r, nil
	n.ns.dport = r.port
	for _, p := range n.proxies {
		p.retarget(fmt.Sprintf("%s:%d", n.ns.inner, r.port))
	}
	log.Printf("failover: the replica on port %d is the primary", r.port)
	return nil
}

// healAll makes sure nothing of the schedule is left in force: no drop
// rule, no delay, the link up, every instance running.
func (n *nemesis) healAll() error {
	bg := context.Background()
	err := n.ns.heal(bg)
	for _, p := range n.proxies {
		p.setDelay(0)
	}
	if _, lerr := run(bg, "ip", "link", "set", n.ns.host, "up"); lerr != nil {
		err = errors.Join(err, lerr)
	}
	for _, in := range n.instances {
		in.mu.Lock()
		down := in.cmd == nil
		in.mu.Unlock()
		if down {
			err = errors.Join(err, in.startRetrying(bg, 30*time.Second))
		}
	}
	return err
}

// counts is the faults applied, as name:count in the order first applied.
func (n *nemesis) counts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var s []string
	for _, f := range n.order {
		s = append(s, fmt.Sprintf("%s:%d", f, n.applied[f]))
	}
	return s
}

// cleanup undoes what the run made, last made first, once.
type cleanup struct {
	mu    sync.Mutex
	steps []step
}

type step struct {
	what string
	undo func() error
}

func (c *cleanup) add(what string, undo func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, step{what, undo})
}

// newCleanup is a cleanup of its own that parent also runs, so a step
// added to it is undone at the latest when the parent's are.
func newCleanup(parent *cleanup) *cleanup {
	c := &cleanup{}
	parent.add("steps of a store's round", c.run)
	return c
}

// run undoes every step, also after one fails, and returns their errors.
func (c *cleanup) run() error {
	c.mu.Lock()
	steps := c.steps
	c.steps = nil
	c.mu.Unlock()
	var err error
	for i := len(steps) - 1; i >= 0; i-- {
		if e := steps[i].undo(); e != nil {
			err = errors.Join(err, fmt.Errorf("clean-up of %s: %w", steps[i].what, e))
		}
	}
	return err
}
