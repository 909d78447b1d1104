package idemredis

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/fanout"
)

// subscribeTimeout bounds Subscribe's wait for the server to confirm the
// first subscription.
const subscribeTimeout = 5 * time.Second

// Channel returns the pub/sub channel on which the store publishes, and
// its Subscribe listens: the prefix followed by "notify".
func (s *Store) Channel() string { return s.prefix + "notify" }

// Subscribe implements idemstore.Notifier with Redis pub/sub. The first
// subscription opens one go-redis PubSub connection, outside the client's
// pool, and SUBSCRIBEs to Channel; when it breaks, go-redis opens it again
// and subscribes again, with a backoff of up to 5 s between attempts
// (messages published meanwhile are lost, which costs waiters their poll
// interval). From the moment Subscribe returns, the settle and release
// scripts of this store also PUBLISH idemstore.NotifyID(principal, key)
// when they change the record: no round trip more. A store with no
// subscription publishes nothing. The last stop closes the connection.
//
// On a Cluster the store uses plain (not sharded) pub/sub: a script
// publishes on the primary that owns the record, and the Cluster
// forwards the message to the node the subscriber listens on, whichever
// that is.
//
// Subscribe returns an error, and subscribes nothing, when the server
// does not confirm the first subscription within 5 s. stop waits for a
// call of fn in progress to return, so fn must not call it.
func (s *Store) Subscribe(fn func(id string)) (stop func(), err error) {
	stop, err = s.hub.Subscribe(fn, func() (fanout.Listen, error) {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
		defer cancel()
		ps := s.client.Subscribe(ctx, s.Channel())
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			return nil, err
		}
		return func(ctx context.Context, deliver func(string)) { listen(ctx, ps, deliver) }, nil
	})
	if err != nil {
		return nil, wrap("subscribe", err)
	}
	return stop, nil
}

// listen hands the messages ps receives to deliver until ctx ends, which
// closes ps. A failed receive is followed by a backoff; the next one
// reconnects.
func listen(ctx context.Context, ps *redis.PubSub, deliver func(string)) {
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		if stop() {
			_ = ps.Close()
		}
	}()
	var backoff fanout.Backoff
	for {
		msg, err := ps.Receive(ctx)
		switch m := msg.(type) {
		case *redis.Message:
			deliver(m.Payload)
			backoff.Reset()
			continue
		case *redis.Subscription, *redis.Pong:
			backoff.Reset()
			continue
		}
		if err != nil && (ctx.Err() != nil || !backoff.Wait(ctx)) {
			return
		}
	}
}

// withNotify appends the store's channel and l's NotifyID to a settle or
// release script's arguments when the store has a subscription.
func (s *Store) withNotify(args []any, l idemstore.Lease) []any {
	if !s.hub.Publishing() {
		return args
	}
	return append(args, s.Channel(), idemstore.NotifyID(l.Principal, l.Key))
}

var _ idemstore.Notifier = (*Store)(nil)
