// Command nemesis runs the example payments service through faults that
// the service's process cannot see coming: its PostgreSQL crashing with
// pg_ctl stop -m immediate, a network partition that leaves connections
// half open, packet loss, latency, a link going down, and one instance
// SIGKILLed while the others carry on. Clients make payments with fresh
// keys and retry each with the same body until a final answer; at the end
// the history is checked key by key against the database: one payment per
// key answered 201, every final answer of a key byte-identical, no charge
// twice at the provider. It prints one summary line per store and exits
// non-zero on any broken promise.
//
// It makes everything it uses and removes it again, also when interrupted:
// a PostgreSQL cluster of its own (initdb into a temporary folder), for
// -stores gorm-mysql a MariaDB server of its own (mariadb-install-db), a
// network namespace holding the database's end of a veth pair with
// addresses in 10.213.0.0/16 (checked to be on no interface or route of
// the machine, and guarded by an unreachable route so that nothing leaves
// the machine), iptables rules inside that namespace only, and the service
// processes. It needs root (namespaces, iptables) and Debian's PostgreSQL
// 15 server programs.
//
//	cd examples && go run ./nemesis                    # about 5 minutes: pgx, then GORM on PostgreSQL
//	go run ./nemesis -duration 40s -stores pgx         # a short round
//	go run ./nemesis -replica                          # and a failover to a streaming replica
//	go run ./nemesis -duration 2m -stores gorm-mysql   # GORM on MariaDB
//
// With -proxy it runs only its delaying proxy, without root, until
// interrupted: a link with latency between a service and its database on
// one machine, for measuring what round trips cost (BENCHMARKS.md):
//
//	go run ./nemesis -proxy 127.0.0.1:6543=127.0.0.1:5432 -proxy-delay 250us
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	duration      time.Duration
	stores        []string
	instances     int
	clients       int
	durableClaims bool
	provider      bool
	race          bool
	keyTimeout    time.Duration
	gap           time.Duration
	subnet        string
	lease         time.Duration
	reqTimeout    time.Duration
	storeTimeout  time.Duration
	latency       time.Duration
	loss          float64
	partition     time.Duration
	hold          time.Duration
	faults        []string
	keep          bool
	replica       bool
}

var allFaults = []string{"db-crash", "kill", "partition", "loss", "latency", "link-down", "failover"}

func main() {
	var o options
	var stores, faults string
	flag.DurationVar(&o.duration, "duration", 4*time.Minute, "load time in all, shared by the stores (each adds about 20s of set-up and drain)")
	flag.StringVar(&stores, "stores", "pgx,gorm-postgres", "the example's stores to run, one after the other, each on its own database")
	flag.IntVar(&o.instances, "instances", 3, "service instances per store, all on one database")
	flag.IntVar(&o.clients, "clients", 12, "concurrent clients, each with one key at a time")
	flag.BoolVar(&o.durableClaims, "durable-claims", false, "start the services with -durable-claims (idem.Config.DurableClaims)")
	flag.BoolVar(&o.provider, "provider", true, "charge every payment through the example's fake provider (an effect outside the database)")
	flag.BoolVar(&o.race, "race", false, "build the service with -race")
	flag.DurationVar(&o.keyTimeout, "key-timeout", 60*time.Second, "how long a client retries one key before counting it unresolved")
	flag.DurationVar(&o.gap, "gap", 4*time.Second, "quiet time between two faults")
	flag.StringVar(&o.subnet, "subnet", "", "the /30 for the veth pair (default one of 10.213.0.0/16 picked by pid)")
	flag.DurationVar(&o.lease, "lease", 6*time.Second, "the services' -lease")
	flag.DurationVar(&o.reqTimeout, "request-timeout", 3*time.Second, "the services' -request-timeout")
	flag.DurationVar(&o.storeTimeout, "store-timeout", 2*time.Second, "the services' -store-timeout")
	flag.DurationVar(&o.latency, "latency", 300*time.Millisecond, "the latency fault's delay, each way, on one instance's database connections")
	flag.Float64Var(&o.loss, "loss", 0.1, "the loss fault's share of packets dropped each way")
	flag.DurationVar(&o.partition, "partition", 8*time.Second, "how long a partition lasts (past the lease by default)")
	flag.DurationVar(&o.hold, "hold", 12*time.Second, "how long loss, latency and a link down last")
	flag.StringVar(&faults, "faults", strings.Join(allFaults[:6], ","), "the schedule, applied in order and again from the start")
	flag.BoolVar(&o.replica, "replica", false, "give each store's round a streaming replica (pg_basebackup -R) and end the schedule with a failover to it")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (logs, the cluster's files) for a look afterwards")
	proxy := flag.String("proxy", "", "LISTEN=TARGET: only forward TCP from LISTEN (loopback) to TARGET, each chunk held back -proxy-delay each way, until interrupted")
	proxyDelay := flag.Duration("proxy-delay", 250*time.Microsecond, "with -proxy, the delay each way")
	flag.Parse()
	if *proxy != "" {
		if err := runProxy(*proxy, *proxyDelay); err != nil {
			log.Fatalf("nemesis: -proxy: %v", err)
		}
		return
	}
	o.stores = strings.Split(stores, ",")
	o.faults = strings.Split(faults, ",")
	if o.replica && !slices.Contains(o.faults, "failover") {
		o.faults = append(o.faults, "failover")
	}
	for _, f := range o.faults {
		if !slices.Contains(allFaults, f) {
			log.Fatalf("nemesis: unknown fault %q: want some of %s", f, strings.Join(allFaults, ","))
		}
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("nemesis: ")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	cl := &cleanup{}
	failed, err := runAll(ctx, cl, o)
	// The signals stay caught while the clean-up runs: a second Ctrl-C
	// does not leave the namespace or the cluster behind.
	if cerr := cl.run(); cerr != nil && err == nil {
		err = cerr
	}
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		log.Printf("interrupted; everything the run made is removed (%v)", err)
		os.Exit(130)
	case err != nil:
		log.Printf("%v", err)
		os.Exit(2)
	case failed:
		os.Exit(1)
	}
}

// runProxy forwards from LISTEN to TARGET (spec "LISTEN=TARGET") with delay
// each way until SIGINT or SIGTERM.
func runProxy(spec string, delay time.Duration) error {
	listen, target, ok := strings.Cut(spec, "=")
	if !ok || listen == "" || target == "" {
		return fmt.Errorf("want LISTEN=TARGET, got %q", spec)
	}
	if host, _, err := net.SplitHostPort(listen); err != nil || !isLoopback(host) {
		return fmt.Errorf("LISTEN %q must be a loopback address with a port", listen)
	}
	if delay < 0 {
		return fmt.Errorf("-proxy-delay %v is negative", delay)
	}
	p, err := newDelayProxy(listen, target)
	if err != nil {
		return err
	}
	p.setDelay(delay)
	log.Printf("forwarding %s to %s, %v each way", p.addr(), target, delay)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return p.close()
}

// isLoopback reports whether host is a loopback IP address.
func isLoopback(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func runAll(ctx context.Context, cl *cleanup, o options) (failed bool, err error) {
	if os.Geteuid() != 0 {
		return false, errors.New("needs root: it makes a network namespace and iptables rules")
	}
	progs := []string{"ip", "iptables", "runuser", filepath.Join(pgBin, "initdb")}
	if slices.Contains(o.stores, "gorm-mysql") {
		progs = append(progs, "mariadb-install-db", "/usr/sbin/mariadbd")
	}
	for _, prog := range progs {
		if _, err := os.Stat(prog); err != nil && !onPath(prog) {
			return false, fmt.Errorf("%s is missing (apt-get install iproute2 iptables postgresql-15 mariadb-server)", prog)
		}
	}
	removeLeftovers(ctx, log.Printf)
	// The folder's name carries the pid, for removeLeftovers, unless it is
	// to be kept.
	pattern := fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())
	if o.keep {
		pattern = nsPrefix + "kept-"
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return false, err
	}
	// The cluster's own folder is its server user's: let that user reach it.
	if err := os.Chmod(dir, 0o711); err != nil {
		return false, err
	}
	if o.keep {
		log.Printf("keeping %s", dir)
	} else {
		cl.add("folder "+dir, func() error { return os.RemoveAll(dir) })
	}
	log.Printf("building examples/payments")
	bin, err := buildPayments(ctx, dir, o.race)
	if err != nil {
		return false, err
	}
	prefix := subnetFor(os.Getpid())
	if o.subnet != "" {
		if prefix, err = netip.ParsePrefix(o.subnet); err != nil || prefix.Bits() != 30 || !prefix.Addr().Is4() {
			return false, fmt.Errorf("-subnet %q: want an IPv4 /30", o.subnet)
		}
	}
	const port, mysqlPort = 54329, 33069
	ns, err := newNetns(ctx, cl, prefix.Masked(), port)
	if err != nil {
		return false, err
	}
	log.Printf("namespace %s: the databases at %s (PostgreSQL :%d, MariaDB :%d) behind veth %s (%s)", ns.name, ns.inner, port, mysqlPort, ns.host, ns.outer)
	// The servers the stores need: PostgreSQL for all but gorm-mysql,
	// MariaDB for that one.
	var pg, my database
	for _, store := range o.stores {
		switch {
		case store == "gorm-mysql" && my == nil:
			srvDir := filepath.Join(dir, "mariadb")
			if err := os.Mkdir(srvDir, 0o700); err != nil {
				return false, err
			}
			m, err := newMariaDB(ctx, srvDir, ns, mysqlPort)
			if err != nil {
				return false, err
			}
			if err := m.start(ctx); err != nil {
				_ = m.stop()
				return false, err
			}
			cl.add("MariaDB server", m.stop)
			my = m
		case store != "gorm-mysql" && pg == nil:
			pgDir := filepath.Join(dir, "pg")
			if err := os.Mkdir(pgDir, 0o700); err != nil {
				return false, err
			}
			c, err := newCluster(ctx, pgDir, ns, port)
			if err != nil {
				return false, err
			}
			if err := c.start(ctx); err != nil {
				return false, err
			}
			cl.add("PostgreSQL cluster", c.stop)
			pg = c
		}
	}
	per := o.duration / time.Duration(len(o.stores))
	for _, store := range o.stores {
		if ctx.Err() != nil {
			break
		}
		db := &pg
		if store == "gorm-mysql" {
			db = &my
		}
		f, err := runStore(ctx, cl, o, store, bin, dir, db, ns, per)
		if err != nil {
			return true, fmt.Errorf("store %s: %w", store, err)
		}
		failed = failed || f
	}
	return failed, ctx.Err()
}

// runStore runs the load and the fault schedule on one store for d, heals
// everything, lets the clients finish their keys, and checks the history.
func runStore(ctx context.Context, cl *cleanup, o options, store, bin, dir string, primary *database, ns *netns, d time.Duration) (bool, error) {
	db := *primary
	dbName := "nm_" + strings.ReplaceAll(store, "-", "_")
	if err := db.recreate(ctx, dbName); err != nil {
		return false, err
	}
	// The faults and the proxies aim at this round's server.
	ns.dport = db.listenPort()
	n := &nemesis{db: db, ns: ns, o: o, cl: cl}
	if c, ok := db.(*cluster); ok && o.replica {
		r, err := c.replicate(ctx, c.port+1)
		if err != nil {
			return false, err
		}
		n.replica = r
		cl.add("replica on port "+strconv.Itoa(r.port), r.stop)
		log.Printf("%s: streaming replica on port %d", store, r.port)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	common := []string{"-fingerprint-key", hex.EncodeToString(key), "-lease", o.lease.String(),
		"-request-timeout", o.reqTimeout.String(), "-store-timeout", o.storeTimeout.String()}
	var all []*instance
	local := newCleanup(cl)
	defer local.run()
	logFile := func(name string) (*os.File, error) {
		f, err := os.Create(filepath.Join(dir, store+"-"+name+".log"))
		if err == nil {
			local.add("log "+name, f.Close)
		}
		return f, err
	}
	var provider *instance
	if o.provider {
		f, err := logFile("provider")
		if err != nil {
			return false, err
		}
		provider = &instance{name: "provider", bin: bin, args: []string{"-provider-only"}, log: f}
		if err := provider.start(ctx); err != nil {
			return false, err
		}
		local.add("provider", provider.stop)
		common = append(common, "-provider-url", provider.base())
	}
	if o.durableClaims {
		common = append(common, "-durable-claims")
	}
	frameworks := []string{"gin", "nethttp", "echo", "fiber"}
	var proxies []*delayProxy
	for i := range o.instances {
		p, err := newDelayProxy("127.0.0.1:0", fmt.Sprintf("%s:%d", ns.inner, ns.dport))
		if err != nil {
			return false, err
		}
		local.add("proxy", p.close)
		proxies = append(proxies, p)
		f, err := logFile("svc" + strconv.Itoa(i))
		if err != nil {
			return false, err
		}
		dsn := db.serviceDSN(p.addr(), dbName)
		in := &instance{name: fmt.Sprintf("%s-%d", store, i), bin: bin, log: f,
			args: append([]string{"-store", store, "-dsn", dsn, "-framework", frameworks[i%len(frameworks)]}, common...)}
		if err := in.startRetrying(ctx, 30*time.Second); err != nil {
			return false, err
		}
		local.add("instance "+in.name, in.stop)
		all = append(all, in)
	}
	log.Printf("%s: %d instances up (%s), %d clients, load for %v", store, len(all), instanceAddrs(all), o.clients, d)

	w := &workload{instances: all, clients: o.clients, keyTimeout: o.keyTimeout, run: strconv.Itoa(os.Getpid())}
	load, endLoad := context.WithTimeout(ctx, d)
	defer endLoad()
	n.instances, n.proxies = all, proxies
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); n.schedule(load) }()
	w.drive(load, ctx)
	wg.Wait()
	if err := n.healAll(); err != nil {
		return false, fmt.Errorf("healing after the schedule: %w", err)
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	*primary = n.db       // after a failover, the promoted replica
	if n.replica != nil { // never promoted: the next round makes its own
		if err := n.replica.stop(); err != nil {
			return false, err
		}
		if err := os.RemoveAll(n.replica.data); err != nil {
			return false, err
		}
	}
	state, err := readState(ctx, n.db, dbName, provider)
	if err != nil {
		return false, err
	}
	r := check(w.histories, state)
	fmt.Println(r.summary(store, n.counts(), w.requests.Load()))
	for _, e := range r.examples {
		fmt.Println("  " + e)
	}
	log.Printf("%s: answers %s; fault errors: %d", store, statusCounts(w), n.errors)
	if r.slowest != nil {
		log.Printf("%s: the slowest key, %s, took %v: %s", store, r.slowest.key, r.slowest.took.Round(10*time.Millisecond),
			strings.Join(r.slowest.trail, "; "))
	}
	return r.failed(), nil
}

func instanceAddrs(all []*instance) string {
	var s []string
	for _, in := range all {
		s = append(s, in.base())
	}
	return join(s)
}

func statusCounts(w *workload) string {
	var s []string
	w.statuses.Range(func(k, v any) bool {
		s = append(s, fmt.Sprintf("%v=%d", k, v.(interface{ Load() int64 }).Load()))
		return true
	})
	return join(s)
}

func onPath(prog string) bool {
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, prog)); err == nil {
			return true
		}
	}
	return false
}
