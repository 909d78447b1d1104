package idemredis

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/stores/internal/fanout"
)

// Store is an idemstore.Store on Redis or Valkey. It is safe for concurrent use
// by many goroutines and many processes sharing the server. It hands the
// handler no database transaction (see Tx and NoTx). Create it with New.
//
// It keeps no per-record nonce (idem.Record.Nonce is empty), so
// idem.DownstreamKey is derived from the principal, the key and the step
// only. Redis can lose records (a restart without persistence, a failover
// to a replica that missed the claim), and the retry that a lost record
// lets run must send the provider, and write into the unique column, the
// same downstream key as the attempt before it. The price is the one the
// per-record nonce removes on the SQL stores: a key claimed again after its
// record expired gets the same downstream key, so Retention must cover the
// provider's key window, and a unique column answers such a request with
// the earlier effect.
type Store struct {
	client       redis.UniversalClient
	cluster      *redis.ClusterClient // client, when it is a Cluster client
	prefix       string
	waitReplicas int
	waitTimeout  time.Duration
	hub          fanout.Hub // Subscribe's subscriptions and listener
}

// Option configures a Store.
type Option func(*config) error

type config struct {
	prefix       string
	waitReplicas int
	waitTimeout  time.Duration
}

// WithPrefix sets the prefix of every key the store writes (DefaultPrefix
// unless set), so that several applications or environments can share a
// server. At most 64 bytes, without '{' or '}' (the store sets the Cluster
// hash tag itself). Records written under one prefix are invisible under
// another.
func WithPrefix(p string) Option {
	return func(c *config) error {
		if err := checkPrefix(p); err != nil {
			return err
		}
		c.prefix = p
		return nil
	}
}

// WithWaitReplicas makes every claim that grants a key (a first claim, the
// replacement of an expired record, the claim of a released one, or a
// takeover) wait, with Redis's WAIT, until n replicas have acknowledged it,
// for at most timeout. The claim runs on a connection of its own and WAIT
// follows on the same connection once the claim's answer says it granted
// the key, so such a claim costs two round trips plus the replication
// delay. A claim that grants nothing (a replay, an in-progress conflict, a
// fingerprint mismatch) wrote nothing, does not wait and costs one round
// trip, whether or not the replicas answer. Settle, Release and Keep do not
// wait. A claim on such a connection that breaks is not sent again by
// go-redis: Claim returns the error, wrapping idemstore.ErrTransient.
//
// A granted claim fewer than n replicas acknowledged in time makes Claim
// return an error wrapping ErrNotReplicated and idemstore.ErrTransient (the
// client sees a retryable 503). A fresh claim is released again by the
// store, so the client's retry claims afresh; a takeover is left in
// progress under the new lease token for the caller to end, since the
// record it took over may hold an outcome nobody knows yet: the engine
// keeps it (Store.Keep) when Config.Reconcile is set, so that the next
// takeover asks Reconcile again, and releases it otherwise.
//
// WAIT does not make a write durable: a failover can still promote a
// replica that missed it, only less often. It narrows the window in which
// a failover to a replica that had not received the claim lets a second
// attempt claim the key while the first still runs; the handler's unique
// downstream-key write (see the package documentation) is what makes that
// case safe. The default is 0: no waiting.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("idemredis: wait replicas must not be negative, got %d", n)
		}
		if n > 0 && timeout <= 0 {
			return fmt.Errorf("idemredis: wait replicas: the timeout must be positive, got %v (WAIT 0 would wait forever)", timeout)
		}
		c.waitReplicas, c.waitTimeout = n, timeout
		return nil
	}
}

// New returns a Store on client: a *redis.Client, a Sentinel failover
// client (redis.NewFailoverClient) or a *redis.ClusterClient, as
// redis.NewUniversalClient makes them. It does not touch the server: call
// Check (or Migrate) at start-up. It returns an error for a nil client or
// an invalid option.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("idemredis: nil client")
	}
	c := config{prefix: DefaultPrefix}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	s := &Store{client: client, prefix: c.prefix, waitReplicas: c.waitReplicas, waitTimeout: c.waitTimeout}
	s.cluster, _ = client.(*redis.ClusterClient)
	if s.waitReplicas > 0 {
		// WAIT answers within its timeout; the connection's read timeout
		// must leave it room, or every slow WAIT breaks the connection.
		var readTimeout time.Duration
		switch c := client.(type) {
		case *redis.Client:
			readTimeout = c.Options().ReadTimeout
		case *redis.ClusterClient:
			readTimeout = c.Options().ReadTimeout
		}
		if readTimeout > 0 && s.waitTimeout >= readTimeout {
			return nil, fmt.Errorf("idemredis: wait replicas: the timeout %v must be shorter than the client's ReadTimeout %v", s.waitTimeout, readTimeout)
		}
	}
	return s, nil
}

// Prefix returns the prefix of the store's keys.
func (s *Store) Prefix() string { return s.prefix }

// minVersion is the oldest server the scripts run on: Redis 5 replicates
// scripts by their effects by default, which TIME followed by writes needs.
const minVersion = 5

// Check verifies that the store can work: every primary answers, runs
// Redis (or Valkey) 5 or later, and accepts the store's scripts, which it
// loads into each primary's script cache. With WithWaitReplicas it also
// checks that each primary has at least that many replicas connected. The
// error wraps idem.ErrMisconfigured when retrying cannot fix it, and
// idemstore.ErrTransient when the server is unreachable.
//
// Redis has no schema: there is nothing to create, so Check is also what
// Migrate does.
func (s *Store) Check(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return wrap("check", err)
	}
	err := s.forEachPrimary(ctx, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server", "replication").Result()
		if err != nil {
			return err
		}
		fields := infoFields(info)
		v := fields["redis_version"]
		major, _, _ := strings.Cut(v, ".")
		if n, err := strconv.Atoi(major); err != nil || n < minVersion {
			return fmt.Errorf("%w: %s runs redis_version %q, idemredis needs %d or later",
				idem.ErrMisconfigured, c.Options().Addr, v, minVersion)
		}
		if s.waitReplicas > 0 {
			n, _ := strconv.Atoi(fields["connected_slaves"])
			if n < s.waitReplicas {
				return fmt.Errorf("%w: %s has %d connected replicas, WithWaitReplicas asks for %d",
					idem.ErrMisconfigured, c.Options().Addr, n, s.waitReplicas)
			}
		}
		for _, sc := range scripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, idem.ErrMisconfigured) {
			return fmt.Errorf("idemredis: check: %w", err)
		}
		return wrap("check", err)
	}
	return nil
}

// Migrate exists so that a program written for a SQL store's start-up
// (Migrate, then serve) works unchanged: Redis has no schema and nothing
// needs creating, so Migrate does what Check does. There is no Schema
// method for the same reason; the key layout is in the package
// documentation.
func (s *Store) Migrate(ctx context.Context) error { return s.Check(ctx) }

// forEachPrimary runs fn on every primary: each Cluster primary, or the
// one server (the current primary of a Sentinel failover client).
func (s *Store) forEachPrimary(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	if s.cluster != nil {
		return s.cluster.ForEachMaster(ctx, fn)
	}
	c, ok := s.client.(*redis.Client)
	if !ok {
		return fmt.Errorf("%w: idemredis supports *redis.Client, Sentinel failover and *redis.ClusterClient clients, not %T",
			idem.ErrMisconfigured, s.client)
	}
	return fn(ctx, c)
}

func infoFields(info string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// Claim implements idemstore.Store with one script run: one round trip, however
// the claim ends (granted, taken over, or the existing record returned), and
// a replay writes nothing. With WithWaitReplicas, a claim that granted the
// key is followed by WAIT, and only such a claim (see WithWaitReplicas).
//
// req.Durable is ignored, and the store does not make claims durable: it
// keeps no nonce, so a claim that Redis loses takes back nothing a
// downstream key depends on (see Store). Durable could be mapped onto
// WithWaitReplicas's WAIT; it is not, because WAIT is replication, not
// durability (the replicas hold the claim in memory, as the primary does),
// so it would not give Durable's guarantee while it made the claims that
// ask for it wait for replicas a server may not have.
//
// A claim whose answer was lost is sent again by go-redis (its MaxRetries);
// the script recognises its own token and answers as the first run did, so
// the caller holds the key instead of being locked out by its own claim.
func (s *Store) Claim(ctx context.Context, req idemstore.ClaimRequest) (idemstore.ClaimResult, error) {
	if req.Principal == "" || req.Key == "" || req.Token == "" {
		return idemstore.ClaimResult{}, errors.New("idemredis: claim: principal, key and token must not be empty")
	}
	if req.Retention <= 0 {
		return idemstore.ClaimResult{}, fmt.Errorf("idemredis: claim: retention must be positive, got %v", req.Retention)
	}
	req.RequestID = idemstore.BoundRequestID(req.RequestID)
	k := s.keysFor(req.Principal, req.Key)
	keys := []string{k.record, k.index}
	takeOverUncertain := "0"
	if req.TakeOverUncertain {
		takeOverUncertain = "1"
	}
	args := []any{k.member, req.Fingerprint, req.Token, req.RequestID, micros(req.Lease), micros(req.Retention), takeOverUncertain}
	var (
		vals []any
		err  error
	)
	if s.waitReplicas > 0 {
		vals, err = s.claimAndWait(ctx, req, k, keys, args)
	} else {
		vals, err = claimScript.Run(ctx, s.client, keys, args...).Slice()
	}
	if err != nil {
		return idemstore.ClaimResult{}, wrap("claim", err)
	}
	return decodeClaim(req.Principal, req.Key, vals)
}

// claimAndWait runs the claim script on a connection of its own to the
// primary that owns the record and, when the claim granted the key, WAIT on
// that same connection (WAIT counts the replicas that acknowledged the
// connection's own writes). A claim that granted nothing (a replay, a
// conflict, a mismatch) wrote nothing and does not wait. A fresh claim that
// too few replicas acknowledged is released again; a takeover is left held
// by req.Token for the caller to end (see WithWaitReplicas).
func (s *Store) claimAndWait(ctx context.Context, req idemstore.ClaimRequest, k keys, keys []string, args []any) ([]any, error) {
	node, err := s.primaryFor(ctx, k.record)
	if err != nil {
		return nil, err
	}
	conn := node.Conn()
	defer conn.Close()
	vals, err := claimScript.Run(ctx, conn, keys, args...).Slice()
	if err != nil {
		if s.cluster != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")) {
			s.cluster.ReloadState(ctx) // the slot moved: the next claim asks the right primary
		}
		return nil, err
	}
	if len(vals) < 2 || vals[0] != int64(1) {
		return vals, nil
	}
	acked, werr := conn.Do(ctx, "wait", s.waitReplicas, s.waitTimeout.Milliseconds()).Int64()
	if werr == nil && acked >= int64(s.waitReplicas) {
		return vals, nil
	}
	if vals[1] != int64(1) {
		// On the claim's connection, which it holds already, unless WAIT
		// broke it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.waitTimeout+time.Second)
		defer cancel()
		if releaseScript.Run(rctx, conn, keys, k.member, req.Token).Err() != nil {
			_ = s.Release(rctx, idemstore.Lease{Principal: req.Principal, Key: req.Key, Token: req.Token})
		}
	}
	if werr != nil {
		return nil, fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, werr)
	}
	return nil, fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, acked, s.waitReplicas, s.waitTimeout)
}

// primaryFor returns the client of the primary that owns key: the Cluster
// primary of its slot, or the one server.
func (s *Store) primaryFor(ctx context.Context, key string) (*redis.Client, error) {
	if s.cluster != nil {
		return s.cluster.MasterForKey(ctx, key)
	}
	c, ok := s.client.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("%w: WithWaitReplicas needs a *redis.Client, Sentinel failover or *redis.ClusterClient client, not %T",
			idem.ErrMisconfigured, s.client)
	}
	return c, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// decodeClaim turns the claim script's answer into a ClaimResult.
func decodeClaim(principal, key string, vals []any) (idemstore.ClaimResult, error) {
	if len(vals) < 3 {
		return idemstore.ClaimResult{}, wrap("claim", fmt.Errorf("%w: claim answered %d values", ErrCorruptRecord, len(vals)))
	}
	claimed, _ := vals[0].(int64)
	reclaimed, _ := vals[1].(int64)
	nowStr, _ := vals[2].(string)
	now, err := strconv.ParseInt(nowStr, 10, 64)
	if err != nil {
		return idemstore.ClaimResult{}, wrap("claim", fmt.Errorf("%w: server time %q", ErrCorruptRecord, nowStr))
	}
	fields, err := flatFields(vals[3:])
	if err != nil {
		return idemstore.ClaimResult{}, wrap("claim", err)
	}
	rec, err := decodeRecord(principal, key, fields)
	if err != nil {
		return idemstore.ClaimResult{}, wrap("claim", err)
	}
	return idemstore.ClaimResult{Claimed: claimed == 1, Reclaimed: claimed == 1 && reclaimed == 1, Record: rec, Now: time.UnixMicro(now)}, nil
}

// flatFields turns a script's field, value, … list into a map.
func flatFields(vals []any) (map[string]string, error) {
	if len(vals)%2 != 0 {
		return nil, fmt.Errorf("%w: odd field list", ErrCorruptRecord)
	}
	m := make(map[string]string, len(vals)/2)
	for i := 0; i < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		v, ok2 := vals[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: field %v is not a string", ErrCorruptRecord, vals[i])
		}
		m[k] = v
	}
	return m, nil
}

// decodeRecord decodes a record's hash. Everything it returns is freshly
// allocated: the caller owns it.
func decodeRecord(principal, key string, f map[string]string) (idem.Record, error) {
	rec := idem.Record{
		Principal: principal, Key: key, Fingerprint: []byte(f["f"]), State: idemstore.State(f["s"]),
		LeaseToken: f["t"], RequestID: f["q"], Uncertain: f["u"] == "1",
	}
	if !rec.State.Valid() {
		return idem.Record{}, fmt.Errorf("%w: state %q", ErrCorruptRecord, f["s"])
	}
	for _, tf := range []struct {
		name string
		dst  *time.Time
	}{{"c", &rec.CreatedAt}, {"l", &rec.LockedAt}, {"e", &rec.LeaseExpiresAt}, {"x", &rec.ExpiresAt}} {
		us, err := strconv.ParseInt(f[tf.name], 10, 64)
		if err != nil {
			return idem.Record{}, fmt.Errorf("%w: time %s=%q", ErrCorruptRecord, tf.name, f[tf.name])
		}
		*tf.dst = time.UnixMicro(us)
	}
	if rec.State == idemstore.StateInProgress || rec.State == idemstore.StateReleased {
		return rec, nil // no response stored
	}
	status, err := strconv.Atoi(f["code"])
	if err != nil {
		return idem.Record{}, fmt.Errorf("%w: status %q", ErrCorruptRecord, f["code"])
	}
	h, err := idemstore.DecodeHeader([]byte(f["h"]))
	if err != nil {
		return idem.Record{}, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	rec.Response = &idem.Response{Status: status, Header: h, Body: []byte(f["b"])}
	return rec, nil
}

// Release implements idemstore.Store: one script run, fenced by the lease token
// and the in-progress state, that also clears the Uncertain mark. It
// returns idemstore.ErrLeaseLost when the record is gone, settled, or held by
// another token. A release whose answer was lost and that go-redis sent
// again finds nothing the second time and reports ErrLeaseLost, which is
// true: the lease holds nothing any more.
func (s *Store) Release(ctx context.Context, l idemstore.Lease) error {
	return s.endLease(ctx, "release", releaseScript, l)
}

// Keep implements idemstore.Store: one script run, fenced like Release, that
// marks the record Uncertain and sets its lease deadline to the server's
// now, leaving it in progress under the same token and with the expiry its
// claim set. A keep whose answer was lost and that go-redis sent again finds
// the record still held by the token and marks it again, so it reports
// success.
func (s *Store) Keep(ctx context.Context, l idemstore.Lease) error {
	return s.endLease(ctx, "keep", keepScript, l)
}

// endLease runs a script of the Release kind, fenced by l's token.
func (s *Store) endLease(ctx context.Context, op string, sc *redis.Script, l idemstore.Lease) error {
	k := s.keysFor(l.Principal, l.Key)
	args := []any{k.member, l.Token}
	if sc == releaseScript {
		args = s.withNotify(args, l)
	}
	n, err := sc.Run(ctx, s.client, []string{k.record, k.index}, args...).Int64()
	if err != nil {
		return wrap(op, err)
	}
	if n != 1 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Get implements idemstore.Store: one HGETALL. A record past its ExpiresAt is
// gone (Redis expired it), so Get returns idemstore.ErrNotFound for it.
func (s *Store) Get(ctx context.Context, principal, key string) (idem.Record, error) {
	f, err := s.client.HGetAll(ctx, s.keysFor(principal, key).record).Result()
	if err != nil {
		return idem.Record{}, wrap("get", err)
	}
	if len(f) == 0 {
		return idem.Record{}, idemstore.ErrNotFound
	}
	rec, err := decodeRecord(principal, key, f)
	return rec, wrap("get", err)
}

// PurgeExpired implements idemstore.Store and deletes nothing: Redis deletes
// every record itself when its ExpiresAt passes (the record's key carries
// PEXPIREAT), so there is never anything left to purge. It returns 0 and
// no error, so an idem.Sweeper runs unchanged (and still reports stale
// claims through ListStale).
func (s *Store) PurgeExpired(ctx context.Context, limit int) (int, error) { return 0, nil }

// ListStale implements idemstore.Store without KEYS or SCAN: it reads the
// in-progress index of every shard (IndexShards scripts in one pipeline,
// one round trip per Cluster primary), which is scored by lease deadline,
// takes the limit entries whose lease ended longest ago on each primary's
// clock, and reads their records (a second pipeline). Uncertain records
// (Keep) are among them, since Keep ends the lease. Index entries whose
// record is no longer in progress (it expired in progress) are removed on
// the way. It returns at most limit records, the longest expired first;
// fewer when some of those entries were such leftovers or changed
// meanwhile. Its cost is bounded by limit per shard, whatever the number of
// records.
func (s *Store) ListStale(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	type entry struct {
		shard      int
		member     string
		score, now int64
	}
	var cmds []*redis.Cmd
	err := s.pipelinedScript(ctx, staleScript, func(p redis.Pipeliner, eval func(redis.Scripter, []string, ...any) *redis.Cmd) {
		cmds = cmds[:0]
		for shard := range IndexShards {
			cmds = append(cmds, eval(p, []string{s.indexKey(shard)}, limit))
		}
	}, func() []*redis.Cmd { return cmds })
	if err != nil {
		return nil, wrap("list stale", err)
	}
	var entries []entry
	for shard, cmd := range cmds {
		vals, err := cmd.Slice()
		if err != nil || len(vals)%2 != 1 {
			return nil, wrap("list stale", cmp.Or(err, fmt.Errorf("%w: index answer of %d values", ErrCorruptRecord, len(vals))))
		}
		now, err := strconv.ParseInt(fmt.Sprint(vals[0]), 10, 64)
		if err != nil {
			return nil, wrap("list stale", fmt.Errorf("%w: server time %v", ErrCorruptRecord, vals[0]))
		}
		for i := 1; i < len(vals); i += 2 {
			member, _ := vals[i].(string)
			score, err := strconv.ParseFloat(fmt.Sprint(vals[i+1]), 64)
			if err != nil {
				return nil, wrap("list stale", fmt.Errorf("%w: index score %v", ErrCorruptRecord, vals[i+1]))
			}
			entries = append(entries, entry{shard: shard, member: member, score: int64(score), now: now})
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.score, b.score) })
	entries = entries[:min(len(entries), limit)]
	if len(entries) == 0 {
		return nil, nil
	}

	reads := make([]*redis.MapStringStringCmd, len(entries))
	_, err = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			reads[i] = p.HGetAll(ctx, s.recordKey(e.shard, e.member))
		}
		return nil
	})
	if err != nil {
		return nil, wrap("list stale", err)
	}
	var (
		out   []idem.Record
		prune []entry
	)
	for i, e := range entries {
		f := reads[i].Val()
		principal, key, err := splitMember(e.member)
		if err != nil {
			return nil, wrap("list stale", fmt.Errorf("%w: index member %q", ErrCorruptRecord, e.member))
		}
		if len(f) == 0 || f["s"] != string(idemstore.StateInProgress) {
			prune = append(prune, e)
			continue
		}
		rec, err := decodeRecord(principal, key, f)
		if err != nil {
			return nil, wrap("list stale", err)
		}
		if rec.LeaseExpiresAt.UnixMicro() > e.now {
			continue // taken over since the index was read: its lease is fresh
		}
		out = append(out, rec)
	}
	if len(prune) > 0 {
		// Best effort: a leftover that stays is removed by the next call.
		var pcmds []*redis.Cmd
		_ = s.pipelinedScript(ctx, pruneScript, func(p redis.Pipeliner, eval func(redis.Scripter, []string, ...any) *redis.Cmd) {
			pcmds = pcmds[:0]
			for _, e := range prune {
				pcmds = append(pcmds, eval(p, []string{s.recordKey(e.shard, e.member), s.indexKey(e.shard)}, e.member))
			}
		}, func() []*redis.Cmd { return pcmds })
	}
	slices.SortStableFunc(out, func(a, b idem.Record) int { return a.LeaseExpiresAt.Compare(b.LeaseExpiresAt) })
	return out, nil
}

// pipelinedScript runs the script calls fill queues in one pipeline with
// EVALSHA; when a server answers NOSCRIPT (it restarted, or its script
// cache was flushed) it runs them again with EVAL, which caches the script.
func (s *Store) pipelinedScript(ctx context.Context, sc *redis.Script,
	fill func(redis.Pipeliner, func(redis.Scripter, []string, ...any) *redis.Cmd), queued func() []*redis.Cmd) error {
	for attempt := 0; ; attempt++ {
		eval := func(p redis.Scripter, keys []string, args ...any) *redis.Cmd {
			if attempt == 0 {
				return sc.EvalSha(ctx, p, keys, args...)
			}
			return sc.Eval(ctx, p, keys, args...)
		}
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			fill(p, eval)
			return nil
		})
		noScript := false
		for _, c := range queued() {
			if isNoScript(c.Err()) {
				noScript = true
			}
		}
		if noScript && attempt == 0 {
			continue
		}
		if err != nil {
			return err
		}
		return nil
	}
}

var _ idemstore.Store = (*Store)(nil)
