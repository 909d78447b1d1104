package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/idemgo/idem/core/idemstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The soaks: many clients retry their keys against one or several example
// processes while the test SIGKILLs a process at a random moment of a
// random request and restarts it on the same database. Every key must end
// with exactly one payment and one 201 body, and no key may stay blocked
// past its lease.
//
// By default each soak is short (a time budget of soakShortBudget, a few
// rounds), so it runs in make test. IDEM_SOAK=<duration> (make soak sets
// it from SOAKTIME) runs each of them for that long.

// Soak timing: a short handler delay so that many requests are in flight,
// and the shortest lease these timeouts allow, so that a round waits for a
// dead holder's lease for no longer than it must.
const (
	soakTimeout = 1 * time.Second
	soakStoreTO = 1 * time.Second
	soakLease   = 2500 * time.Millisecond
	// soakSlack is what a key's measured block may exceed the lease by:
	// the block is measured from when the holder's request was sent, so it
	// includes the holder's wait for a connection or SQLite's write lock
	// before its claim, plus a slow -race process on a busy machine.
	soakSlack = 1 * time.Second
	// soakRetryPause is a client's pause between attempts, jittered up to
	// twice as long. It ignores Retry-After (at least 1s) so that the time
	// a key stays blocked is measured closely.
	soakRetryPause = 50 * time.Millisecond

	soakShortBudget = 25 * time.Second
	soakShortRounds = 8
	soakLongRounds  = 100000
)

// soakBudget returns how long a soak may start new rounds and how many it
// may run at most: short by default, IDEM_SOAK when it is set.
func soakBudget(t *testing.T) (time.Duration, int) {
	v := os.Getenv("IDEM_SOAK")
	if v == "" {
		return soakShortBudget, soakShortRounds
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("IDEM_SOAK=%q: want a positive duration such as 10m", v)
	}
	return d, soakLongRounds
}

// soakPlan is the shape of one soak.
type soakPlan struct {
	store     string
	instances int // example processes on the one database
	clients   int
	ownKeys   int // keys per client per round that only that client retries
	shared    int // keys per round retried by several clients at once
	sharers   int // clients retrying each shared key
	delay     time.Duration
}

// killWithin bounds when, after a round's clients start, the test picks
// the request whose process it kills. Every client sends at least ownKeys
// requests one after another, each held by the handler for delay, so until
// ownKeys×delay every client still has a request in flight and the pick
// cannot come after the round's work is done. (A fixed 800ms did: a Redis
// round of 14 keys finished in 200ms and eight kills hit idle processes.)
func (p soakPlan) killWithin() time.Duration { return time.Duration(p.ownKeys) * p.delay }

// TestCrashSoak SIGKILLs the service, once per round, at a random moment
// of a random request among many concurrent ones, restarts it on the same
// database and lets the retrying clients finish every key.
func TestCrashSoak(t *testing.T) {
	plans := []soakPlan{
		{store: "pgx", instances: 1, clients: 10, ownKeys: 3, shared: 3, sharers: 3,
			delay: 150 * time.Millisecond},
		// SQLite has a single writer: fewer clients and a shorter handler
		// delay, or the claims queue behind each other for seconds.
		{store: "sqlite", instances: 1, clients: 6, ownKeys: 2, shared: 2, sharers: 3,
			delay: 50 * time.Millisecond},
		// Redis: records in Redis, payments in an SQLite file (the single
		// writer again, so the SQLite plan). A kill after the payment row
		// committed and before the settle leaves the row without its
		// record's outcome: the takeover must answer from that row.
		{store: "redis", instances: 1, clients: 6, ownKeys: 2, shared: 2, sharers: 3,
			delay: 50 * time.Millisecond},
	}
	for _, p := range plans {
		t.Run(p.store, func(t *testing.T) {
			t.Parallel()
			runSoak(t, p)
		})
	}
}

// TestManyInstances runs three example processes on one PostgreSQL
// database, as users scale out, and spreads concurrent retries of the same
// keys round-robin across them while one instance per round is SIGKILLed
// and restarted.
func TestManyInstances(t *testing.T) {
	for _, store := range []string{"pgx", "gorm-postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			runSoak(t, soakPlan{store: store, instances: 3, clients: 9, ownKeys: 1, shared: 9, sharers: 3,
				delay: 150 * time.Millisecond})
		})
	}
}

// soakCluster is the set of example processes of one soak, all on one
// database. Clients read an instance's address on every attempt, because
// a restarted process listens on a new port.
type soakCluster struct {
	t     *testing.T
	args  []string
	mu    sync.Mutex
	procs []*proc
	bases []atomic.Pointer[string]
}

func newSoakCluster(t *testing.T, n int, args []string) *soakCluster {
	c := &soakCluster{t: t, args: args, procs: make([]*proc, n), bases: make([]atomic.Pointer[string], n)}
	for i := range n {
		// One after another: the first creates the tables.
		c.start(i)
	}
	return c
}

func (c *soakCluster) start(i int) {
	p := startService(c.t, c.args...)
	c.mu.Lock()
	c.procs[i] = p
	c.mu.Unlock()
	base := p.base
	c.bases[i].Store(&base)
}

func (c *soakCluster) base(i int) string { return *c.bases[i].Load() }

func (c *soakCluster) proc(i int) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[i]
}

// soakAttempt is one request a client sent, as the checks need it.
type soakAttempt struct {
	client   int
	instance int
	sent     time.Time
	end      time.Time
	status   int  // 0: no HTTP answer
	refused  bool // the connection was refused: the request reached no process
	replayed bool
	body     []byte // of a 201
	err      error
}

// soakKey is one idempotency key of a round: its own account, so that the
// account's payments are exactly the key's.
type soakKey struct {
	account, key, body string
	clients            []int

	mu       sync.Mutex
	attempts []soakAttempt
}

func (k *soakKey) add(a soakAttempt) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.attempts = append(k.attempts, a)
}

// inflight lists the requests being sent, for the killer to choose from.
type inflight struct {
	mu   sync.Mutex
	next int
	reqs map[int]inflightReq
}

type inflightReq struct {
	instance int
	sent     time.Time
	key      string
}

func (f *inflight) add(r inflightReq) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.reqs[f.next] = r
	return f.next
}

func (f *inflight) done(id int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reqs, id)
}

func (f *inflight) pick(rng *rand.Rand) (inflightReq, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		return inflightReq{}, false
	}
	ids := make([]int, 0, len(f.reqs))
	for id := range f.reqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return f.reqs[ids[rng.IntN(len(ids))]], true
}

// soakTotals adds up a soak's rounds.
type soakTotals struct {
	rounds, kills, keys, requests, conflicts, transport, refused, other int
	fresh, replays, takeovers, duplicates                               int
	longestBlock, longestKey                                            time.Duration
	blockKey                                                            string
}

func runSoak(t *testing.T, plan soakPlan) {
	budget, maxRounds := soakBudget(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))
	args, dsn := storeArgs(t, plan.store)
	args = append(args, "-handler-delay", plan.delay.String(),
		"-request-timeout", soakTimeout.String(), "-store-timeout", soakStoreTO.String(), "-lease", soakLease.String())
	hc := &http.Client{
		Timeout:   20 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	started := time.Now()
	cl := newSoakCluster(t, plan.instances, args)
	db := openCheckDB(t, plan.store, dsn)
	var records idemstore.Store
	if plan.store == "redis" {
		records = openCheckRedis(t)
	}
	t.Logf("%s: %d instance(s), %d clients, %d keys per round, handler delay %v, lease %v, budget %v (max %d rounds), seed %d",
		plan.store, plan.instances, plan.clients, plan.clients*plan.ownKeys+plan.shared, plan.delay, soakLease,
		budget, maxRounds, seed)

	run := randHex(3)
	var tot soakTotals
	lastStale := map[*proc]int{}
	for round := 1; round <= maxRounds && time.Since(started) < budget; round++ {
		soakRound(ctx, t, plan, cl, hc, db, records, rng, fmt.Sprintf("s%s-%d-", run, round), &tot, lastStale)
		if t.Failed() {
			break
		}
	}
	t.Logf("%s: %d rounds, %d kills, %d keys, %d requests (%d fresh 201, %d replayed 201, %d 409, %d cut by a kill, "+
		"%d refused while down, %d other), %d takeovers of a dead holder's claim, duplicates %d, "+
		"longest block %v (lease %v, key %s), longest time to finish a key %v, in %v",
		plan.store, tot.rounds, tot.kills, tot.keys, tot.requests, tot.fresh, tot.replays, tot.conflicts, tot.transport,
		tot.refused, tot.other, tot.takeovers, tot.duplicates, tot.longestBlock.Round(time.Millisecond), soakLease,
		tot.blockKey, tot.longestKey.Round(time.Millisecond), time.Since(started).Round(time.Second))
	if tot.duplicates != 0 {
		t.Errorf("%d duplicates, want 0", tot.duplicates)
	}
	if tot.kills == 0 || tot.takeovers == 0 {
		t.Errorf("%d kills, %d takeovers: no kill left a claim behind, so the soak proved nothing", tot.kills, tot.takeovers)
	}
}

// soakRound runs one round: fresh keys, clients retrying them until 201,
// one instance killed at a random moment of a random request and
// restarted; then the checks.
func soakRound(ctx context.Context, t *testing.T, plan soakPlan, cl *soakCluster, hc *http.Client, db *gorm.DB,
	records idemstore.Store, rng *rand.Rand, prefix string, tot *soakTotals, lastStale map[*proc]int) {
	// Keys: each client's own, then the shared ones, each given to sharers
	// distinct clients and put near the front of their lists so that the
	// sharers retry it at the same time.
	var keys []*soakKey
	lists := make([][]*soakKey, plan.clients)
	newKey := func(clients ...int) *soakKey {
		i := len(keys)
		k := &soakKey{account: prefix + strconv.Itoa(i), key: "key-" + prefix + strconv.Itoa(i), clients: clients,
			body: fmt.Sprintf(`{"amount": %d, "currency": "EUR", "description": "soak %s%d"}`, 100+i, prefix, i)}
		keys = append(keys, k)
		return k
	}
	for c := range plan.clients {
		for range plan.ownKeys {
			lists[c] = append(lists[c], newKey(c))
		}
	}
	for range plan.shared {
		sharers := rng.Perm(plan.clients)[:plan.sharers]
		k := newKey(sharers...)
		for _, c := range sharers {
			at := rng.IntN(min(2, len(lists[c])) + 1)
			lists[c] = slices.Insert(lists[c], at, k)
		}
	}

	roundStart := time.Now()
	deadline := roundStart.Add(4*soakLease + 60*time.Second)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	flight := &inflight{reqs: map[int]inflightReq{}}
	var wg sync.WaitGroup
	var unfinished atomic.Int32
	for c := range plan.clients {
		wg.Go(func() {
			attemptNo := c
			for _, k := range lists[c] {
				if !soakClientKey(rctx, hc, cl, flight, c, &attemptNo, k) {
					unfinished.Add(1)
				}
			}
		})
	}

	// The kill: a random request in flight, at a random point of its life
	// (claim, handler, settle, commit or the reply), then a restart.
	time.Sleep(time.Duration(rng.Int64N(int64(plan.killWithin()))))
	var victim inflightReq
	picked := false
	for range 200 {
		if victim, picked = flight.pick(rng); picked {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !picked {
		victim = inflightReq{instance: rng.IntN(plan.instances), sent: time.Now(), key: "(none in flight)"}
	}
	killAt := victim.sent.Add(time.Duration(rng.Int64N(int64(plan.delay + plan.delay/2))))
	time.Sleep(time.Until(killAt))
	cl.proc(victim.instance).kill()
	offset := time.Since(victim.sent)
	killedAt := time.Since(roundStart)
	restartStart := time.Now()
	cl.start(victim.instance)
	restart := time.Since(restartStart)
	tot.kills++

	wg.Wait()
	if n := unfinished.Load(); n > 0 {
		t.Errorf("%s: %d client keys not finished by the round's deadline (%v)", prefix, n, deadline.Sub(roundStart))
	}

	// Takeovers, from the live processes' metrics: those of a process
	// killed since its last reading are lost, so this is a lower bound.
	stale := 0
	for i := range plan.instances {
		p := cl.proc(i)
		n := staleReclaimed(t, hc, p.base)
		stale += n - lastStale[p]
		lastStale[p] = n
	}

	rs := checkSoakRound(t, plan.store, cl, hc, db, records, prefix, keys)
	tot.rounds++
	tot.keys += len(keys)
	tot.requests += rs.requests
	tot.conflicts += rs.conflicts
	tot.transport += rs.transport
	tot.refused += rs.refused
	tot.other += rs.other
	tot.fresh += rs.fresh
	tot.replays += rs.replays
	tot.takeovers += stale
	tot.duplicates += rs.duplicates
	if rs.longestBlock > tot.longestBlock {
		tot.longestBlock, tot.blockKey = rs.longestBlock, rs.blockKey
	}
	tot.longestKey = max(tot.longestKey, rs.longestKey)
	t.Logf("%s round %d: killed instance %d at +%v, %v into a request for %s; restarted in %v; %d keys, %d requests, "+
		"%d 409, %d cut, %d refused, %d takeovers, longest block %v, round %v",
		plan.store, tot.rounds, victim.instance, killedAt.Round(time.Millisecond), offset.Round(time.Millisecond),
		victim.key, restart.Round(time.Millisecond), len(keys), rs.requests, rs.conflicts, rs.transport, rs.refused,
		stale, rs.longestBlock.Round(time.Millisecond), time.Since(roundStart).Round(time.Millisecond))
}

// soakClientKey retries k until a 201, sending each attempt to the next
// instance in turn. It reports whether the key finished.
func soakClientKey(ctx context.Context, hc *http.Client, cl *soakCluster, flight *inflight, client int,
	attemptNo *int, k *soakKey) bool {
	n := len(cl.bases)
	for range 10000 {
		if ctx.Err() != nil {
			return false
		}
		inst := *attemptNo % n
		*attemptNo++
		a := soakAttempt{client: client, instance: inst, sent: time.Now()}
		id := flight.add(inflightReq{instance: inst, sent: a.sent, key: k.key})
		r, err := soakPost(ctx, hc, cl.base(inst), k)
		flight.done(id)
		a.end, a.status, a.err = time.Now(), r.status, err
		if err != nil {
			a.status = 0
			a.refused = errors.Is(err, syscall.ECONNREFUSED)
		}
		if a.status == http.StatusCreated {
			a.replayed, a.body = r.replayed(), r.body
		}
		k.add(a)
		switch a.status {
		case http.StatusCreated:
			return true
		case 0, http.StatusConflict, http.StatusServiceUnavailable:
		default:
			// Anything else is a failure the checks report; stop here.
			return true
		}
		pause := soakRetryPause + rand.N(soakRetryPause)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(pause):
		}
	}
	return false
}

func soakPost(ctx context.Context, hc *http.Client, base string, k *soakKey) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/payments", strings.NewReader(k.body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+k.account)
	req.Header.Set("Idempotency-Key", k.key)
	// net/http resends a request that carries an Idempotency-Key on a new
	// connection when a reused one fails; that resend would hide from the
	// checks which request the kill cut. Make it unreplayable: every
	// attempt is the client's own.
	req.GetBody = nil
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// soakRoundStats is what the checks of one round found.
type soakRoundStats struct {
	requests, conflicts, transport, refused, other, fresh, replays, duplicates int
	longestBlock, longestKey                                                   time.Duration
	blockKey                                                                   string
}

// checkSoakRound checks every key of a round: each client's last answer a
// 201, all 201 bodies identical, at most one of them fresh, exactly one
// payment (through the API and counted in the database), the record
// completed, and the key never blocked past its lease. records is the
// Redis store of a redis soak, nil for the SQL stores (their records are
// read from db).
func checkSoakRound(t *testing.T, store string, cl *soakCluster, hc *http.Client, db *gorm.DB, records idemstore.Store,
	prefix string, keys []*soakKey) soakRoundStats {
	t.Helper()
	var rs soakRoundStats
	for _, k := range keys {
		slices.SortFunc(k.attempts, func(a, b soakAttempt) int { return a.sent.Compare(b.sent) })
		var body []byte
		fresh := 0
		lastByClient := map[int]soakAttempt{}
		for _, a := range k.attempts {
			rs.requests++
			lastByClient[a.client] = a
			switch {
			case a.status == 0 && a.refused:
				rs.refused++
			case a.status == 0:
				rs.transport++
			case a.status == http.StatusConflict:
				rs.conflicts++
			case a.status == http.StatusCreated:
				if a.replayed {
					rs.replays++
				} else {
					fresh++
					rs.fresh++
				}
				if body == nil {
					body = a.body
				} else if !bytes.Equal(body, a.body) {
					t.Errorf("%s: two different 201 bodies:\n%s\n%s", k.key, body, a.body)
				}
			default:
				rs.other++
				if a.status != http.StatusServiceUnavailable {
					t.Errorf("%s: client %d got %d %s", k.key, a.client, a.status, bytes.TrimSpace(a.body))
				}
			}
		}
		for _, c := range k.clients {
			if a, ok := lastByClient[c]; !ok || a.status != http.StatusCreated {
				t.Errorf("%s: client %d did not finish with a 201 (last: %d %v)", k.key, c, a.status, a.err)
			}
		}
		if fresh > 1 {
			rs.duplicates += fresh - 1
			t.Errorf("%s: %d fresh 201s: the handler's work was committed more than once", k.key, fresh)
		}
		if body == nil {
			continue
		}
		// Exactly one payment, and it is the one every client was told of.
		ps := soakPayments(t, hc, cl.base(0), k.account)
		if len(ps) > 1 {
			rs.duplicates += len(ps) - 1
		}
		if len(ps) != 1 {
			t.Errorf("%s: %d payments, want 1: %+v", k.key, len(ps), ps)
		} else {
			var p paymentJSON
			if err := json.Unmarshal(body, &p); err != nil || p != ps[0] {
				t.Errorf("%s: listed %+v, but the clients were told %s", k.key, ps[0], body)
			}
		}
		block := soakBlock(k.attempts)
		if block > rs.longestBlock {
			rs.longestBlock, rs.blockKey = block, k.key
		}
		if block > soakLease+soakSlack {
			t.Errorf("%s: blocked for %v, more than the lease %v (+%v): %s", k.key, block, soakLease, soakSlack,
				describeAttempts(k.attempts))
		}
		if len(k.attempts) > 0 {
			var done time.Time
			for _, a := range k.attempts {
				if a.status == http.StatusCreated && a.end.After(done) {
					done = a.end
				}
			}
			rs.longestKey = max(rs.longestKey, done.Sub(k.attempts[0].sent))
		}
	}

	// The database agrees: one payment per key and every record completed,
	// none left in progress.
	var payments int64
	table := "payments"
	if records != nil {
		table = "redis_payments"
	}
	if err := db.Raw("SELECT count(*) FROM "+table+" WHERE account LIKE ?", prefix+"%").Scan(&payments).Error; err != nil {
		t.Fatalf("counting payments: %v", err)
	}
	if int(payments) != len(keys) {
		t.Errorf("%s: %d payments in the database for %d keys", prefix, payments, len(keys))
		if int(payments) > len(keys) && rs.duplicates == 0 {
			rs.duplicates = int(payments) - len(keys)
		}
	}
	if records != nil {
		checkRedisRecords(t, records, prefix, keys)
		return rs
	}
	// Both SQL stores qualify their default table with the schema the
	// DSN's search_path selects, so the same unqualified name finds it.
	recordsTable := idemgorm.DefaultTable
	var states []struct {
		State string
		N     int
	}
	if err := db.Raw("SELECT state, count(*) AS n FROM "+recordsTable+" WHERE principal LIKE ? GROUP BY state",
		prefix+"%").Scan(&states).Error; err != nil {
		t.Fatalf("counting records: %v", err)
	}
	if len(states) != 1 || states[0].State != "completed" || states[0].N != len(keys) {
		t.Errorf("%s: records by state %+v, want %d completed", prefix, states, len(keys))
	}
	return rs
}

// soakBlock returns the longest time a key was refused with 409 by one
// claim. For each 409 it looks for the claim that refused it: a request
// that reached a process (not refused at connect, not itself a 409 or a
// replay), sent before the 409 was answered, and either still unanswered
// when the 409 was sent or cut by the kill (a dead holder's claim outlives
// it). A candidate is out once a later request is known to have claimed
// the key (a fresh 201, or another answer that is not a 409) before the
// 409 was answered: that claim could only be made once the candidate's
// was gone. The block is measured from the earliest remaining candidate's
// send to the 409's send, so it includes the holder's wait for its claim.
func soakBlock(attempts []soakAttempt) time.Duration {
	claimed := func(a soakAttempt) bool {
		return a.status != 0 && a.status != http.StatusConflict && !(a.status == http.StatusCreated && a.replayed)
	}
	var longest time.Duration
	for _, r := range attempts {
		if r.status != http.StatusConflict {
			continue
		}
		var start time.Time
		for _, a := range attempts {
			switch {
			case a.status == http.StatusConflict, a.refused, a.status == http.StatusCreated && a.replayed,
				a.sent.After(r.end), a.status != 0 && a.end.Before(r.sent):
				continue
			}
			superseded := slices.ContainsFunc(attempts, func(f soakAttempt) bool {
				return claimed(f) && f.sent.After(a.sent) && !f.sent.After(r.end)
			})
			if !superseded && (start.IsZero() || a.sent.Before(start)) {
				start = a.sent
			}
		}
		if !start.IsZero() {
			longest = max(longest, r.sent.Sub(start))
		}
	}
	return longest
}

func describeAttempts(as []soakAttempt) string {
	var b strings.Builder
	t0 := as[0].sent
	for _, a := range as {
		fmt.Fprintf(&b, "\n  client %d instance %d sent +%v answered +%v: %d", a.client, a.instance,
			a.sent.Sub(t0).Round(time.Millisecond), a.end.Sub(t0).Round(time.Millisecond), a.status)
		if a.replayed {
			b.WriteString(" replayed")
		}
		if a.err != nil {
			fmt.Fprintf(&b, " (%v)", a.err)
		}
	}
	return b.String()
}

func soakPayments(t *testing.T, hc *http.Client, base, account string) []paymentJSON {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/payments", nil)
	req.Header.Set("Authorization", "Bearer "+account)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET /payments: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Payments []paymentJSON `json:"payments"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /payments: %d %v", resp.StatusCode, err)
	}
	return out.Payments
}

// staleReclaimed reads the stale_reclaimed counter of a process.
func staleReclaimed(t *testing.T, hc *http.Client, base string) int {
	t.Helper()
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if n, found := outcomeCount(t, string(b), "stale_reclaimed"); found {
		return int(n)
	}
	t.Fatalf("no stale_reclaimed counter in /metrics")
	return 0
}

// openCheckDB opens the soak's database from the test, to count what the
// processes wrote.
func openCheckDB(t *testing.T, store, dsn string) *gorm.DB {
	t.Helper()
	var d gorm.Dialector
	switch store {
	case "sqlite", "redis": // redis: the payments' SQLite file
		d = sqlite.Open(idemgorm.SQLiteDSN(dsn, 10*time.Second))
	case "pgx", "gorm-postgres":
		d = postgres.Open(dsn)
	default:
		t.Fatalf("no check database for %q", store)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// openCheckRedis opens the Redis of a redis soak, to read the records the
// processes settled (under the example's default prefix).
func openCheckRedis(t *testing.T) idemstore.Store {
	t.Helper()
	o, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	s, err := idemredis.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkRedisRecords checks that every key of a round has its record
// completed in Redis, none left in progress.
func checkRedisRecords(t *testing.T, records idemstore.Store, prefix string, keys []*soakKey) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states := map[idemstore.State]int{}
	for _, k := range keys {
		rec, err := records.Get(ctx, k.account, k.key)
		if err != nil {
			t.Errorf("%s: reading its record: %v", k.key, err)
			continue
		}
		states[rec.State]++
	}
	if len(states) != 1 || states[idemstore.StateCompleted] != len(keys) {
		t.Errorf("%s: records by state %v, want %d completed", prefix, states, len(keys))
	}
}

// TestSoakBlock checks the block measure on recorded shapes: a dead
// holder's block runs from its send to the last 409 it caused, and a 409
// caused by the takeover that followed is not charged to the dead holder.
func TestSoakBlock(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	a := func(client, sent, end, status int, flags ...string) soakAttempt {
		x := soakAttempt{client: client, sent: at(sent), end: at(end), status: status}
		for _, f := range flags {
			x.refused = x.refused || f == "refused"
			x.replayed = x.replayed || f == "replayed"
		}
		return x
	}
	for _, tc := range []struct {
		name     string
		attempts []soakAttempt
		want     time.Duration
	}{
		{"dead holder, own key", []soakAttempt{
			a(1, 0, 300, 0), a(1, 350, 351, 0, "refused"), a(1, 1000, 1010, 409), a(1, 2400, 2410, 409),
			a(1, 2600, 2800, 201),
		}, 2400 * time.Millisecond},
		{"live holder, shared key", []soakAttempt{
			a(1, 0, 200, 201), a(2, 50, 60, 409), a(2, 150, 160, 409), a(2, 250, 260, 201, "replayed"),
		}, 150 * time.Millisecond},
		// From a soak on SQLite: the holder died at +756ms; after the restart
		// client 5's takeover (sent +3827ms) held the key until +5607ms and
		// refused the others; client 4's 409 sent at +3761ms was answered
		// after that takeover.
		{"takeover after a dead holder", []soakAttempt{
			a(4, 0, 756, 0), a(3, 4, 756, 0), a(5, 4, 312, 409), a(5, 484, 758, 0), a(5, 818, 820, 0, "refused"),
			a(4, 3761, 4729, 409), a(3, 3773, 4729, 409), a(5, 3827, 5607, 201), a(3, 5450, 5551, 409),
			a(3, 5633, 5689, 201, "replayed"),
		}, 1623 * time.Millisecond},
	} {
		if got := soakBlock(tc.attempts); got != tc.want {
			t.Errorf("%s: block %v, want %v", tc.name, got, tc.want)
		}
	}
}
