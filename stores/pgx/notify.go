package idempgx

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/fanout"
)

// maxChannel is the longest channel name PostgreSQL keeps (NAMEDATALEN-1):
// LISTEN truncates longer identifiers, pg_notify refuses them.
const maxChannel = 63

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

// Subscribe implements idemstore.Notifier with PostgreSQL's LISTEN/NOTIFY
// for a store built WithNotifications; without it, it returns an error
// wrapping idemstore.ErrNotificationsOff and subscribes nothing.
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
	if !s.notify {
		return nil, fmt.Errorf("idempgx: subscribe: %w (WithNotifications)", idemstore.ErrNotificationsOff)
	}
	stop, err = s.hub.Subscribe(fn, func() (fanout.Listen, error) {
		ctx, cancel := context.WithTimeout(context.Background(), s.txTimeout)
		defer cancel()
		conn, err := s.listenConn(ctx)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, deliver func(string)) { s.listen(ctx, conn, deliver) }, nil
	})
	if err != nil {
		return nil, wrap("subscribe", err)
	}
	return stop, nil
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

// listen hands the notifications conn receives to deliver, and opens
// another connection when conn breaks, until ctx ends.
func (s *Store) listen(ctx context.Context, conn *pgx.Conn, deliver func(string)) {
	var backoff fanout.Backoff
	for {
		if conn != nil {
			for {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					break
				}
				deliver(n.Payload)
			}
			closeCtx, cancel := context.WithTimeout(context.Background(), s.txTimeout)
			_ = conn.Close(closeCtx)
			cancel()
			conn = nil
		}
		if ctx.Err() != nil || !backoff.Wait(ctx) {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, s.txTimeout)
		c, err := s.listenConn(cctx)
		cancel()
		if err == nil {
			conn = c
			backoff.Reset()
		}
	}
}

// queueNotify adds the notification of principal's key to b when the
// store has a subscription, and reports whether it did.
func (s *Store) queueNotify(b *pgx.Batch, principal, key string) bool {
	if !s.hub.Publishing() {
		return false
	}
	b.Queue(notifySQL, s.channel, idemstore.NotifyID(principal, key))
	return true
}

var _ idemstore.Notifier = (*Store)(nil)
