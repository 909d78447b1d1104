// Command loadgen measures throughput and latency of idempotent POSTs
// against a real database: on PostgreSQL (the default) idemhttp + idempgx,
// idemhttp + idemgorm and the hand-written floor (bench.Floor); with -db
// mariadb or -db sqlite idemhttp + idemgorm beside a hand-written floor on
// that database; with -db redis idemhttp + idemredis beside a hand-written
// floor on Redis, both writing the payment to PostgreSQL (bench.OpenTarget).
// Each runs behind a real HTTP server on 127.0.0.1, with 1, 8, 32 and 64
// concurrent clients. Clients post unique keys and, with probability
// -retry, retry one of their recent keys (a replay). Every cell is bounded
// by -duration and every client by -max-requests.
//
//	go run ./cmd/loadgen -duration 5s              # the short form (make bench)
//	go run ./cmd/loadgen -duration 20s             # the long form
//	go run ./cmd/loadgen -db sqlite -duration 5s   # idemgorm on SQLite
//
// With -target it drives servers that are already running instead, such
// as the example service (examples/payments) on different stores; it then
// starts nothing and needs no database itself:
//
//	go run ./cmd/loadgen -target pgx=http://127.0.0.1:8081/payments,redis=http://127.0.0.1:8082/payments
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/bench"
)

func main() {
	var (
		duration    = flag.Duration("duration", 5*time.Second, "length of each cell")
		warmup      = flag.Duration("warmup", time.Second, "warm-up per variant, at 8 clients, not reported")
		clientsFlag = flag.String("clients", "1,8,32,64", "concurrent clients per cell")
		db          = flag.String("db", "postgres", "database: "+strings.Join(bench.Databases, ", "))
		variants    = flag.String("variants", "", "variants to run, of the database's (postgres: floor,pgx,gorm; mariadb, sqlite: floor,gorm; redis: floor,redis); empty: all, floor first")
		retry       = flag.Float64("retry", 0.2, "share of requests that retry a recent key")
		conns       = flag.Int("conns", 12, "database connections per variant")
		maxRequests = flag.Int("max-requests", 1_000_000, "bound on requests per client per cell")
		rounds      = flag.Int("rounds", 1, "times the whole matrix is run (interleaved, for benchstat)")
		benchOut    = flag.String("o", "", "also write every cell in Go benchmark format to this file, for benchstat")
		cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run (server and clients) to this file")
		memProfile  = flag.String("memprofile", "", "write the allocations of the whole run (server and clients) to this file")
		targets     = flag.String("target", "", "name=URL,… of running servers to drive instead of the variants (POST URL must take the example's payment body)")
	)
	flag.Parse()
	log.SetFlags(0)
	var clients []int
	for _, s := range strings.Split(*clientsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			log.Fatalf("bad -clients %q", *clientsFlag)
		}
		clients = append(clients, n)
	}

	if *rounds < 1 || *rounds > 20 {
		log.Fatalf("bad -rounds %d", *rounds)
	}
	var bout io.Writer = io.Discard
	if *benchOut != "" {
		f, err := os.Create(*benchOut)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		bout = f
		fmt.Fprintf(f, "goos: %s\ngoarch: %s\npkg: github.com/idemgo/idem/bench/cmd/loadgen\n", runtime.GOOS, runtime.GOARCH)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err != nil {
				log.Fatal(err)
			}
			defer f.Close()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				log.Fatal(err)
			}
		}()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if *targets != "" {
		runTargets(ctx, *targets, *clientsFlag, clients, *duration, *warmup, *retry, *maxRequests, *rounds, bout)
		return
	}
	target, err := bench.OpenTarget(ctx, *db)
	if err != nil {
		log.Fatalf("loadgen -db %s: %v", *db, err)
	}
	defer target.Close()

	var names []string
	servers := map[string]*server{}
	for _, v := range target.Variants {
		if *variants != "" && !slices.Contains(strings.Split(*variants, ","), v.Name) {
			continue
		}
		h, closeDB, err := v.Open(ctx, *conns, nil)
		if err != nil {
			log.Fatalf("%s: %v", v.Label, err)
		}
		s, err := listen(v.Name, h, closeDB)
		if err != nil {
			log.Fatal(err)
		}
		defer s.close()
		s.label = v.Label
		servers[v.Name] = s
		names = append(names, v.Name)
	}
	if len(names) == 0 {
		log.Fatalf("no variant of -db %s in -variants %q", *db, *variants)
	}
	// The benchmark name carries the database unless it is PostgreSQL,
	// whose names predate the others.
	bname := "BenchmarkLoad"
	if *db != "postgres" {
		bname += "/db=" + *db
	}

	transport := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}

	if err := target.Reset(ctx); err != nil {
		log.Fatal(err)
	}
	for _, name := range names {
		run(ctx, client, servers[name].url, 8, *warmup, *retry, *maxRequests)
	}

	fmt.Printf("# loadgen -db %s -duration %v -clients %s -retry %.2f -conns %d; %s\n", *db, *duration, *clientsFlag, *retry, *conns, loadavg())
	fmt.Println("| variant | clients | req/s | p50 | p99 | 201 first | 201 replayed | 409 | other | errors | load avg (1m) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for range *rounds {
		for _, n := range clients {
			for _, name := range names {
				if err := target.Reset(ctx); err != nil {
					log.Fatal(err)
				}
				r := run(ctx, client, servers[name].url, n, *duration, *retry, *maxRequests)
				fmt.Printf("| %s | %d | %.0f | %s | %s | %d | %d | %d | %d | %d | %s |\n", servers[name].label, n,
					float64(r.requests)/r.elapsed.Seconds(), ms(r.p50), ms(r.p99), r.first, r.replayed, r.conflict, r.other, r.errors,
					strings.Fields(loadavg())[2])
				if r.firstErr != nil {
					fmt.Fprintf(os.Stderr, "%s/%d: first error: %v\n", name, n, r.firstErr)
				}
				if r.requests > 0 {
					fmt.Fprintf(bout, "%s/variant=%s/clients=%d-%d\t%d\t%d ns/op\t%.1f req/s\t%.3f p50-ms\t%.3f p99-ms\n",
						bname, name, n, runtime.GOMAXPROCS(0), r.requests, r.elapsed.Nanoseconds()/int64(r.requests),
						float64(r.requests)/r.elapsed.Seconds(), float64(r.p50.Microseconds())/1000, float64(r.p99.Microseconds())/1000)
				}
			}
		}
	}
}

// runTargets runs the matrix against running servers: name=URL pairs, in
// the order given within each client count.
func runTargets(ctx context.Context, spec, clientsSpec string, clients []int, duration, warmup time.Duration, retry float64,
	maxRequests, rounds int, bout io.Writer) {
	var names, urls []string
	for _, kv := range strings.Split(spec, ",") {
		name, url, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || name == "" || !strings.HasPrefix(url, "http://127.0.0.1:") {
			log.Fatalf("bad -target %q: want name=http://127.0.0.1:PORT/path,…", kv)
		}
		names, urls = append(names, name), append(urls, url)
	}
	transport := &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	for _, url := range urls {
		run(ctx, client, url, 8, warmup, retry, maxRequests)
	}
	fmt.Printf("# loadgen -target %s -duration %v -clients %s -retry %.2f; %s\n", spec, duration, clientsSpec, retry, loadavg())
	fmt.Println("| target | clients | req/s | p50 | p99 | 201 first | 201 replayed | 409 | other | errors | load avg (1m) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for range rounds {
		for _, n := range clients {
			for i, name := range names {
				r := run(ctx, client, urls[i], n, duration, retry, maxRequests)
				fmt.Printf("| %s | %d | %.0f | %s | %s | %d | %d | %d | %d | %d | %s |\n", name, n,
					float64(r.requests)/r.elapsed.Seconds(), ms(r.p50), ms(r.p99), r.first, r.replayed, r.conflict, r.other, r.errors,
					strings.Fields(loadavg())[2])
				if r.firstErr != nil {
					fmt.Fprintf(os.Stderr, "%s/%d: first error: %v\n", name, n, r.firstErr)
				}
				if r.requests > 0 {
					fmt.Fprintf(bout, "BenchmarkLoad/target=%s/clients=%d-%d\t%d\t%d ns/op\t%.1f req/s\t%.3f p50-ms\t%.3f p99-ms\n",
						name, n, runtime.GOMAXPROCS(0), r.requests, r.elapsed.Nanoseconds()/int64(r.requests),
						float64(r.requests)/r.elapsed.Seconds(), float64(r.p50.Microseconds())/1000, float64(r.p99.Microseconds())/1000)
				}
			}
		}
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average: unknown"
	}
	f := strings.Fields(string(b))
	return "load average: " + strings.Join(f[:3], " ")
}

type server struct {
	label   string
	url     string
	srv     *http.Server
	closeDB func()
}

func listen(name string, h http.Handler, closeDB func()) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("%s: %v", name, err)
		}
	}()
	return &server{url: "http://" + ln.Addr().String() + "/payments", srv: srv, closeDB: closeDB}, nil
}

func (s *server) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	s.closeDB()
}

type result struct {
	requests, first, replayed, conflict, other, errors int
	elapsed                                            time.Duration
	p50, p99                                           time.Duration
	firstErr                                           error
}

const body = `{"amount":1000,"currency":"EUR","description":"coffee"}`

// run drives n clients against url for d: each posts a fresh key, or with
// probability retry one of its last 64 keys again.
func run(ctx context.Context, client *http.Client, url string, n int, d time.Duration, retry float64, maxRequests int) result {
	prefix := bench.RandHex(4)
	var (
		mu    sync.Mutex
		total result
		lats  []time.Duration
		wg    sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range n {
		wg.Go(func() {
			var (
				r      result
				mine   = make([]time.Duration, 0, 4096)
				recent = make([]string, 0, 64)
				rng    = rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
				acct   = "acct_" + strconv.Itoa(w)
			)
			for i := 0; i < maxRequests && time.Now().Before(deadline); i++ {
				var key string
				if len(recent) > 0 && rng.Float64() < retry {
					key = recent[rng.IntN(len(recent))]
				} else {
					key = prefix + "-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
					if len(recent) == cap(recent) {
						copy(recent, recent[1:])
						recent = recent[:len(recent)-1]
					}
					recent = append(recent, key)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
				req.Header.Set("Authorization", "Bearer "+acct)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				mine = append(mine, time.Since(t0))
				r.requests++
				switch {
				case resp.StatusCode == http.StatusCreated && resp.Header.Get("Idempotent-Replayed") == "true":
					r.replayed++
				case resp.StatusCode == http.StatusCreated:
					r.first++
				case resp.StatusCode == http.StatusConflict:
					r.conflict++
				default:
					r.other++
					if r.firstErr == nil {
						r.firstErr = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			total.requests += r.requests
			total.first += r.first
			total.replayed += r.replayed
			total.conflict += r.conflict
			total.other += r.other
			total.errors += r.errors
			if total.firstErr == nil {
				total.firstErr = r.firstErr
			}
			lats = append(lats, mine...)
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	slices.Sort(lats)
	if len(lats) > 0 {
		total.p50 = lats[len(lats)*50/100]
		total.p99 = lats[min(len(lats)-1, len(lats)*99/100)]
	}
	return total
}
