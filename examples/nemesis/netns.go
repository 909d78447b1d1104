package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// nsPrefix names every namespace this program makes; the part after it is
// the pid of the run that made it, so a later run can tell a leftover of a
// run that was killed from one that is still going.
const nsPrefix = "idem-nemesis-"

// routeProto tags the unreachable route of a run (ip route ... proto).
const routeProto = "213"

// netns is the network between the services and the database: a network
// namespace holding the database's end of a veth pair. Both ends have
// addresses in a /30 of 10.213.0.0/16 that no interface or route of the
// machine uses, and an unreachable route for that /30 sits below the
// veth's own, so a packet for it never follows the default route out, also
// while the link is down.
type netns struct {
	name         string
	host, peer   string // the veth's ends: host in the machine's namespace, peer inside
	prefix       netip.Prefix
	outer, inner string // the host's address and the database's
	dport        int    // the database's port, which the faults act on
}

// subnetFor is the /30 of 10.213.0.0/16 that the run with this pid uses.
func subnetFor(pid int) netip.Prefix {
	n := pid % 16000
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(n / 64), byte(n % 64 * 4)}), 30)
}

// ip runs the ip command, or the rest of argv inside ns when the first
// word is "netns-exec".
func run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// checkFree fails unless no address of the machine and no route other
// than the default one overlaps p.
func checkFree(ctx context.Context, p netip.Prefix) error {
	addrs, err := run(ctx, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(addrs) {
		if a, err := netip.ParsePrefix(f); err == nil && a.Overlaps(p) {
			return fmt.Errorf("%v overlaps the machine's address %v: pick another -subnet", p, a)
		}
	}
	routes, err := run(ctx, "ip", "-4", "route", "show", "table", "all")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(routes, "\n") {
		for _, f := range strings.Fields(line) {
			if r, err := netip.ParsePrefix(f); err == nil && r.Bits() > 0 && r.Overlaps(p) {
				return fmt.Errorf("%v overlaps the route %q: pick another -subnet", p, strings.TrimSpace(line))
			}
		}
	}
	return nil
}

// newNetns builds the namespace, the veth pair and the guard route for p;
// every step it took is undone by the clean-up it registers.
func newNetns(ctx context.Context, cl *cleanup, p netip.Prefix, dport int) (*netns, error) {
	pid := os.Getpid()
	first := p.Addr().Next()
	n := &netns{
		name: nsPrefix + strconv.Itoa(pid), host: "nmh" + strconv.Itoa(pid), peer: "nmn" + strconv.Itoa(pid),
		prefix: p, outer: first.String(), inner: first.Next().String(), dport: dport,
	}
	if err := checkFree(ctx, p); err != nil {
		return nil, err
	}
	if _, err := run(ctx, "ip", "route", "add", "unreachable", p.String(), "metric", "4242", "proto", routeProto); err != nil {
		return nil, err
	}
	cl.add("unreachable route "+p.String(), func() error {
		_, err := run(context.Background(), "ip", "route", "del", "unreachable", p.String(), "metric", "4242")
		return err
	})
	if err := n.checkRoute(ctx); err != nil {
		return nil, err
	}
	if _, err := run(ctx, "ip", "netns", "add", n.name); err != nil {
		return nil, err
	}
	cl.add("namespace "+n.name, func() error {
		_, err := run(context.Background(), "ip", "netns", "del", n.name)
		return err
	})
	cl.add("veth "+n.host, func() error {
		// Gone with the namespace already when it was made; a pair that
		// never reached it is deleted here.
		if _, err := run(context.Background(), "ip", "link", "show", n.host); err != nil {
			return nil
		}
		_, err := run(context.Background(), "ip", "link", "del", n.host)
		return err
	})
	bits := strconv.Itoa(p.Bits())
	for _, argv := range [][]string{
		{"ip", "link", "add", n.host, "type", "veth", "peer", "name", n.peer},
		{"ip", "link", "set", n.peer, "netns", n.name},
		{"ip", "addr", "add", n.outer + "/" + bits, "dev", n.host},
		{"ip", "link", "set", n.host, "up"},
		{"ip", "-n", n.name, "addr", "add", n.inner + "/" + bits, "dev", n.peer},
		{"ip", "-n", n.name, "link", "set", n.peer, "up"},
		{"ip", "-n", n.name, "link", "set", "lo", "up"},
	} {
		if _, err := run(ctx, argv...); err != nil {
			return nil, err
		}
	}
	return n, n.checkRoute(ctx)
}

// checkRoute fails unless the kernel sends a packet for the database's
// address through the veth or refuses it (the guard route): never by the
// default route, never out of the machine.
func (n *netns) checkRoute(ctx context.Context) error {
	out, err := run(ctx, "ip", "route", "get", n.innerAddr())
	return routeVerdict(n.innerAddr(), n.host, out, err)
}

// routeVerdict judges what `ip route get addr` printed (out, err): safe
// when the packet leaves by the veth's host end or is refused, an error
// otherwise.
func routeVerdict(addr, host, out string, err error) error {
	if err != nil {
		if strings.Contains(out, "unreachable") || strings.Contains(out, "No route to host") {
			return nil
		}
		return err
	}
	first := strings.SplitN(out, "\n", 2)[0]
	fields := strings.Fields(first)
	for i, f := range fields {
		if f == "via" {
			return fmt.Errorf("route to %s goes through a gateway (%q): refusing to send anything", addr, first)
		}
		if f == "dev" && i+1 < len(fields) && fields[i+1] != host {
			return fmt.Errorf("route to %s leaves by %s (%q): refusing to send anything", addr, fields[i+1], first)
		}
	}
	if strings.HasPrefix(first, "unreachable") || strings.Contains(first, "dev "+host+" ") || strings.HasSuffix(first, "dev "+host) {
		return nil
	}
	return fmt.Errorf("unexpected route to %s: %q", addr, first)
}

// innerAddr is the database's address (also before the namespace exists).
func (n *netns) innerAddr() string {
	if n.inner != "" {
		return n.inner
	}
	return n.prefix.Addr().Next().Next().String()
}

// iptables runs iptables inside the namespace: its rules live and die
// with it, and the machine's own tables are never touched.
func (n *netns) iptables(ctx context.Context, args ...string) error {
	_, err := run(ctx, append([]string{"ip", "netns", "exec", n.name, "iptables", "-w", "5"}, args...)...)
	return err
}

// drop installs rules dropping the database's TCP traffic both ways;
// probability < 1 drops that share of packets at random (packet loss), 1
// drops all of them (a partition that leaves every connection half open).
func (n *netns) drop(ctx context.Context, probability float64) error {
	if err := n.checkRoute(ctx); err != nil {
		return err
	}
	match := []string{}
	if probability < 1 {
		match = []string{"-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(probability, 'f', 3, 64)}
	}
	port := strconv.Itoa(n.dport)
	in := append([]string{"-A", "INPUT", "-p", "tcp", "--dport", port}, append(match, "-j", "DROP")...)
	out := append([]string{"-A", "OUTPUT", "-p", "tcp", "--sport", port}, append(match, "-j", "DROP")...)
	if err := n.iptables(ctx, in...); err != nil {
		return err
	}
	return n.iptables(ctx, out...)
}

// heal removes every rule drop installed.
func (n *netns) heal(ctx context.Context) error {
	if err := n.iptables(ctx, "-F", "INPUT"); err != nil {
		return err
	}
	return n.iptables(ctx, "-F", "OUTPUT")
}

// linkDown takes the host's end of the veth down (its route goes, the
// guard route answers) and up again after d.
func (n *netns) linkDown(ctx context.Context, d time.Duration) error {
	if err := n.checkRoute(ctx); err != nil {
		return err
	}
	if _, err := run(ctx, "ip", "link", "set", n.host, "down"); err != nil {
		return err
	}
	if err := n.checkRoute(ctx); err != nil {
		_, _ = run(context.Background(), "ip", "link", "set", n.host, "up")
		return err
	}
	sleep(ctx, d)
	if _, err := run(context.Background(), "ip", "link", "set", n.host, "up"); err != nil {
		return err
	}
	return n.checkRoute(context.Background())
}

// removeLeftovers deletes the namespaces (and their processes and guard
// routes) and the temporary folders of earlier runs whose process is gone:
// a run killed by SIGKILL had no chance to clean up.
func removeLeftovers(ctx context.Context, logf func(string, ...any)) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(f[0], nsPrefix))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		pids, _ := run(ctx, "ip", "netns", "pids", f[0])
		for _, p := range strings.Fields(pids) {
			if n, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(n, syscall.SIGKILL)
			}
		}
		_, _ = run(ctx, "ip", "netns", "del", f[0])
		_, _ = run(ctx, "ip", "route", "del", "unreachable", subnetFor(pid).String(), "metric", "4242")
		logf("removed the leftovers of run %d (namespace %s)", pid, f[0])
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), nsPrefix+"*-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), nsPrefix), "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		if err := os.RemoveAll(d); err == nil {
			logf("removed the folder %s of run %d", d, pid)
		}
	}
}
