package idempgx

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/idemstore"
)

// maxChannel is the longest channel name PostgreSQL keeps (NAMEDATALEN-1):
// LISTEN truncates longer identifiers, pg_notify refuses them.
const maxChannel = 63

// The backoff between the listener's attempts to reconnect: doubled from
// the first up to the last.
const (
	listenBackoffMin = 50 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// notifySQL publishes a notification; it goes into the batch of a settle
// or release, so it costs no round trip and is delivered when that
// transaction commits (and never when it rolls back).
const notifySQL = "SELECT pg_catalog.pg_notify($1, $2)"

// channelName is the notification channel of the table ident (quoted and
// schema-qualified): "idem:" and the name, or, when that is longer than
// PostgreSQL keeps, "idem:" and a hash of it, so that every store of one
// table, in every process, agrees on it.
func channelName(ident string) string {
	if ch := "idem:" + ident; len(ch) <= maxChannel {
		return ch
	}
	sum := sha256.Sum256([]byte(ident))
	return "idem:" + hex.EncodeToString(sum[:16])
}

// Channel returns the name of the PostgreSQL notification channel on which
// the store publishes, and its Subscribe listens: derived from the table,
// at most 63 bytes.
func (s *Store) Channel() string { return s.channel }

// listener is a Store's one listening connection and its subscriptions.
type listener struct {
	publishing atomic.Bool // a subscription exists: settle and release notify

	mu     sync.Mutex
	subs   map[*subscription]struct{}
	cancel context.CancelFunc // stops the running listener, nil when none
	done   chan struct{}      // closed when the last listener has stopped
}

// subscription is one Subscribe's fn; mu is held while fn runs, so that
// stop returns only once no call of fn is in progress.
type subscription struct {
	mu      sync.Mutex
	stopped bool
	fn      func(id string)
}

// Subscribe implements idemstore.Notifier with PostgreSQL's LISTEN/NOTIFY.
// The first subscription opens one listening connection from the pool's
// connection settings (pool.Config().ConnConfig), outside the pool, so it
// takes no pool connection, and LISTENs on Channel; when that connection
// breaks it is opened again with a backoff of up to 5 s (notifications
// sent meanwhile are lost, which costs waiters their poll interval). From
// the moment Subscribe returns, each Settle and Release of this store also
// runs pg_notify(Channel, idemstore.NotifyID(principal, key)) in the batch
// it sends anyway: no round trip more, and a notification only when the
// transaction commits. A store with no subscription sends nothing of the
// sort. The last stop closes the connection.
//
// Subscribe returns an error, and subscribes nothing, when the first
// listening connection cannot be opened within the tx timeout
// (WithTxTimeout). stop waits for a call of fn in progress to return, so
// fn must not call it.
func (s *Store) Subscribe(fn func(id string)) (stop func(), err error) {
	if fn == nil {
		return nil, errors.New("idempgx: subscribe: nil func")
	}
	sub := &subscription{fn: fn}
	l := &s.listener
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel == nil {
		if l.done != nil {
			<-l.done // the previous listener's connection is closed first
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.txTimeout)
		conn, err := s.listenConn(ctx)
		cancel()
		if err != nil {
			return nil, wrap("subscribe", err)
		}
		ctx, l.cancel = context.WithCancel(context.Background())
		l.done = make(chan struct{})
		go s.listen(ctx, conn, l.done)
	}
	if l.subs == nil {
		l.subs = make(map[*subscription]struct{})
	}
	l.subs[sub] = struct{}{}
	l.publishing.Store(true)
	var once sync.Once
	return func() { once.Do(func() { s.unsubscribe(sub) }) }, nil
}

// unsubscribe removes sub, and stops the listener with the last one.
func (s *Store) unsubscribe(sub *subscription) {
	l := &s.listener
	l.mu.Lock()
	delete(l.subs, sub)
	if len(l.subs) == 0 {
		l.publishing.Store(false)
		l.cancel()
		l.cancel = nil
	}
	l.mu.Unlock()
	sub.mu.Lock()
	sub.stopped = true
	sub.mu.Unlock()
}

// listenConn opens a connection outside the pool and LISTENs on the
// store's channel.
func (s *Store) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// listen delivers the notifications conn receives to the subscriptions,
// one at a time, and reconnects when conn breaks, until ctx ends.
func (s *Store) listen(ctx context.Context, conn *pgx.Conn, done chan struct{}) {
	defer close(done)
	backoff := listenBackoffMin
	for {
		if conn != nil {
			for {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					break
				}
				s.deliver(n.Payload)
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), s.txTimeout)
			_ = conn.Close(closeCtx)
			cancel()
			conn = nil
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, listenBackoffMax)
		cctx, cancel := context.WithTimeout(ctx, s.txTimeout)
		c, err := s.listenConn(cctx)
		cancel()
		if err == nil {
			conn, backoff = c, listenBackoffMin
		}
	}
}

// deliver calls every subscription's fn with id.
func (s *Store) deliver(id string) {
	l := &s.listener
	l.mu.Lock()
	subs := make([]*subscription, 0, len(l.subs))
	for sub := range l.subs {
		subs = append(subs, sub)
	}
	l.mu.Unlock()
	for _, sub := range subs {
		sub.mu.Lock()
		if !sub.stopped {
			sub.fn(id)
		}
		sub.mu.Unlock()
	}
}

// queueNotify adds the notification of principal's key to b when the
// store has a subscription, and reports whether it did.
func (s *Store) queueNotify(b *pgx.Batch, principal, key string) bool {
	if !s.listener.publishing.Load() {
		return false
	}
	b.Queue(notifySQL, s.channel, idemstore.NotifyID(principal, key))
	return true
}

var _ idemstore.Notifier = (*Store)(nil)
