package pgsql

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// QueryRow runs query on the handler's transaction's connection and scans
// its one row into dest. A store gives WaitFlushed one that takes the
// transaction's turn, refuses to run on a transaction that is finished,
// aborted or ended behind the store, and wraps nothing: WaitFlushed
// returns its errors as they are.
type QueryRow func(ctx context.Context, query string, dest ...any) error

// Nudge runs NudgeSQL through the store's pool, within NudgeTimeout, when
// the pool has an idle connection or room for a new one, so that it does
// not wait for a connection another request holds, and ignores its
// failure. WaitFlushed calls it while the flush stalls short of its target.
type Nudge func(ctx context.Context)

// NudgeTimeout bounds one Nudge: its wait for the pool and its statement.
const NudgeTimeout = time.Second

// The backoff between WaitFlushed's polls, doubled from the first up to
// the last, and how long the flush may stall before it nudges, and between
// its nudges.
const (
	syncFirstWait = time.Millisecond
	syncMaxWait   = 20 * time.Millisecond
	syncNudgeWait = 400 * time.Millisecond
)

// WaitFlushed is a store's Sync (idemstore.Syncer): it returns once the
// WAL is flushed up to the position the transaction's BEGIN recorded in
// SyncSetting, which is past the claim's commit record (the claim
// committed before the transaction began), so the claim, and the nonce
// every downstream key is made of, survives a database crash.
//
// It runs SyncSQL, then SyncPollSQL, through query, which runs them on the
// transaction's own connection; they read positions only, so the
// transaction is left as it was. It polls 1 ms apart at first and at most
// 20 ms apart; the WAL writer flushes an asynchronous commit within
// wal_writer_delay (200 ms by default), and any synchronous commit on the
// server flushes it sooner. The wait ends with ctx.
//
// The position is BEGIN's rather than the one at the time of the call:
// WAL the handler has written since is not flushed before some commit
// follows it (the WAL writer flushes up to the last asynchronous commit and
// the last completed page), so on a server where nothing else commits,
// waiting for it would last until the background writer's periodic record
// of running transactions, up to 15 s later. BEGIN's position can be past
// another session's WAL as well, written between the claim's commit and
// BEGIN by a transaction still open. So when the flush has stalled short
// of the target for 400 ms, WaitFlushed calls nudge (when it is not nil),
// and again every 400 ms while it stalls: a commit of its own on a free
// connection, which flushes past the target. With no connection free the
// wait goes on until something on the server commits, or that record, and
// ends with ctx. A handler that removed or changed SyncSetting makes
// WaitFlushed wait for the insert position at the call, which is past the
// claim too.
func WaitFlushed(ctx context.Context, query QueryRow, nudge Nudge) error {
	var target LSN
	nudgeAt := time.Now().Add(syncNudgeWait)
	for wait := time.Duration(0); ; wait = min(max(2*wait, syncFirstWait), syncMaxWait) {
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return fmt.Errorf("the claim's WAL (up to %s) is not flushed yet: %w", target, ctx.Err())
			case <-timer.C:
			}
		}
		var f LSN
		if target == 0 {
			var err error
			if target, f, err = SyncTarget(ctx, query); err != nil {
				return err
			}
		} else {
			var flush string
			if err := query(ctx, SyncPollSQL, &flush); err != nil {
				return err
			}
			var err error
			if f, err = ParseLSN(flush); err != nil {
				return err
			}
		}
		if f >= target {
			return nil
		}
		if now := time.Now(); nudge != nil && !now.Before(nudgeAt) {
			nudge(ctx)
			nudgeAt = time.Now().Add(syncNudgeWait)
		}
	}
}

// SyncTarget runs SyncSQL through query: it returns the position
// WaitFlushed waits for (BEGIN's, or the insert position now when the
// handler changed SyncSetting) and the flush position now.
func SyncTarget(ctx context.Context, query QueryRow) (target, flushed LSN, err error) {
	var began *string
	var insert, flush string
	if err := query(ctx, SyncSQL, &began, &insert, &flush); err != nil {
		return 0, 0, err
	}
	now, err := ParseLSN(insert)
	if err != nil {
		return 0, 0, err
	}
	if flushed, err = ParseLSN(flush); err != nil {
		return 0, 0, err
	}
	// BEGIN's position, unless the handler changed the setting to
	// something that is not a position BEGIN can have read.
	target = now
	if began != nil {
		if b, err := ParseLSN(*began); err == nil && b > 0 && b <= now {
			target = b
		}
	}
	return target, flushed, nil
}

// LSN is a WAL position (pg_lsn).
type LSN uint64

// ParseLSN parses pg_lsn's text form, two hexadecimal halves: "16/B374D848".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("not a WAL position: %q", s)
	}
	return LSN(h<<32 | l), nil
}

// String returns the position in pg_lsn's text form.
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint32(l)) }
