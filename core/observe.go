package idem

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/idemgo/idem/core/idemstore"
)

// OutcomeLabel names one request's fate. The values are stable and are meant as
// metric labels.
type OutcomeLabel string

// The outcomes of docs/design.md, one per request.
const (
	OutcomeClaimed             OutcomeLabel = "claimed"              // ran and settled
	OutcomeReplayed            OutcomeLabel = "replayed"             // a stored response was replayed
	OutcomeInProgressConflict  OutcomeLabel = "in_progress_conflict" // 409: another attempt holds the key
	OutcomeFingerprintMismatch OutcomeLabel = "fingerprint_mismatch" // 422: key reused with another request
	OutcomeStaleReclaimed      OutcomeLabel = "stale_reclaimed"      // took over an expired lease, ran and settled
	OutcomeReleased            OutcomeLabel = "released"             // transient outcome: rolled back, claim released
	OutcomeKeyMissing          OutcomeLabel = "key_missing"
	OutcomeKeyInvalid          OutcomeLabel = "key_invalid"
	OutcomeLeaseLost           OutcomeLabel = "lease_lost" // settle fenced out by a takeover
	OutcomeStoreError          OutcomeLabel = "store_error"
	OutcomeUnauthenticated     OutcomeLabel = "unauthenticated"
	OutcomeBodyTooLarge        OutcomeLabel = "body_too_large"
	OutcomeBodyUnreadable      OutcomeLabel = "body_unreadable"
	OutcomeReplayForbidden     OutcomeLabel = "replay_forbidden"
	OutcomeResponseTooLarge    OutcomeLabel = "response_too_large"
	OutcomeNoKey               OutcomeLabel = "no_key"   // optional key absent: passed through
	OutcomeTxEnded             OutcomeLabel = "tx_ended" // the handler ended the transaction; the key stays in progress
	OutcomePrincipalInvalid    OutcomeLabel = "principal_invalid"
	OutcomeResponseInvalid     OutcomeLabel = "response_invalid"  // a header to store is not valid HTTP: rolled back
	OutcomeInFlightLimited     OutcomeLabel = "in_flight_limited" // 429: the principal's MaxInFlightPerPrincipal reached
	OutcomeReplayUnreadable    OutcomeLabel = "replay_unreadable" // the stored body did not open (Config.BodySealer)
	OutcomeUnknown             OutcomeLabel = "outcome_unknown"   // 409: the record's outcome is unknown and no Reconcile is set
	OutcomeTxOwned             OutcomeLabel = "tx_owned"          // the handler called Commit or Rollback on the handle: rolled back
)

// Every label, for observers that pre-register metrics.
var (
	// Outcomes lists every OutcomeLabel.
	Outcomes = []OutcomeLabel{
		OutcomeClaimed, OutcomeReplayed, OutcomeInProgressConflict, OutcomeFingerprintMismatch,
		OutcomeStaleReclaimed, OutcomeReleased, OutcomeKeyMissing, OutcomeKeyInvalid,
		OutcomeLeaseLost, OutcomeStoreError, OutcomeUnauthenticated, OutcomeBodyTooLarge, OutcomeBodyUnreadable,
		OutcomeReplayForbidden, OutcomeResponseTooLarge, OutcomeNoKey, OutcomeTxEnded, OutcomePrincipalInvalid,
		OutcomeResponseInvalid, OutcomeInFlightLimited, OutcomeReplayUnreadable, OutcomeUnknown, OutcomeTxOwned,
	}
	// WaitOutcomes lists every WaitOutcome.
	WaitOutcomes = []WaitOutcome{
		WaitReplayed, WaitClaimedAfterRelease, WaitTimedOut, WaitCancelled, WaitRefused, WaitAnswered,
	}
)

// Event describes one request's passage through the engine. It carries the
// full data (the path with its query string, the raw key, the principal):
// observers are code the application wrote, not a log. The engine's own log
// line is redacted (see Config.LogKeys); an observer that logs or exports
// an Event must redact it the same way.
type Event struct {
	Outcome OutcomeLabel
	Method  string
	// Path is the request target as the client sent it, query included:
	// unbounded cardinality, never a metric label. Use Route for that.
	Path string
	// Route is the route template the adapter matched ("/payments/:id"),
	// or the call's Route; empty when the framework did not say.
	Route     string
	Principal string
	Key       string
	RequestID string
	// OriginalRequestID is, on a replay, the request id the record's
	// original attempt stored (Call.RequestID, Config.RequestIDHeader):
	// it ties the replay to the request that produced the answer, for
	// instance to link their traces. Empty otherwise.
	OriginalRequestID string
	// Status is the status sent to the client.
	Status int
	// ClaimLatency is the time the store's Claim took; zero when no claim
	// was made.
	ClaimLatency time.Duration
	// Duration is the time from Begin to the response being decided.
	Duration time.Duration
	// Err is the error behind a store_error, lease_lost, tx_ended or
	// released outcome, if any, and the principal function's error behind
	// an unauthenticated one.
	Err error
	// Wait is how the request's wait for the attempt holding its key ended
	// (see Config.WaitInFlight), and Waited how long it took; "" and 0 when
	// the request did not wait. A request that claimed the key after the
	// holder released it and ran carries its wait too.
	Wait   WaitOutcome
	Waited time.Duration
	// TxUsed reports whether the handler ran anything through the store's
	// transaction. It is false when no handler ran. A 2xx with TxUsed
	// false means the handler's writes, if any, went around the guarantee.
	TxUsed bool
}

// Observer receives one Event per request. Implementations must be safe for
// concurrent use and should return quickly.
type Observer interface {
	Observe(ctx context.Context, ev Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, ev Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, ev Event) { f(ctx, ev) }

func (e *Engine) emit(ctx context.Context, ev Event) {
	if e.cfg.Observer != nil {
		e.cfg.Observer.Observe(ctx, ev)
	}
	logger, level := e.cfg.Logger, slog.LevelInfo
	switch ev.Outcome {
	case OutcomeStoreError, OutcomeTxEnded, OutcomeUnknown, OutcomeTxOwned:
		level = slog.LevelError
	case OutcomeLeaseLost, OutcomeResponseTooLarge, OutcomeResponseInvalid:
		level = slog.LevelWarn
	}
	unusedTx := !e.cfg.AllowTxUnused && !ev.TxUsed && ev.Status >= 200 && ev.Status < 300 &&
		(ev.Outcome == OutcomeClaimed || ev.Outcome == OutcomeStaleReclaimed)
	// A principal function that fails (an auth backend down, a token it
	// cannot read) turns every request away with 401; a request that
	// simply has no principal is the client's business, but the first one
	// an engine sees may be a middleware placed before authentication.
	principalFailed := ev.Outcome == OutcomeUnauthenticated && ev.Err != nil
	firstAnonymous := ev.Outcome == OutcomeUnauthenticated && ev.Err == nil && e.sawAnonymous.CompareAndSwap(false, true)
	if unusedTx || principalFailed || firstAnonymous {
		level = slog.LevelWarn
	}
	if logger == nil {
		// What an operator must see is logged even without a Logger.
		if level < slog.LevelWarn {
			return
		}
		logger = slog.Default()
	}
	// Most requests log at INFO, which production loggers often leave
	// out: build the line only for a level that is written.
	if !logger.Enabled(ctx, level) {
		return
	}
	msg := "idempotency"
	switch {
	case unusedTx:
		msg = "idempotency: the handler answered 2xx without using the store's transaction; its writes are outside the guarantee (Config.AllowTxUnused turns this off)"
	case principalFailed:
		msg = "idempotency: the principal function failed; the request was answered 401"
	case firstAnonymous:
		msg = "idempotency: a request reached the middleware without a principal and was answered 401; " +
			"if it was authenticated, the idempotency middleware runs before the authentication middleware: place it after (logged once)"
	case ev.Outcome == OutcomeTxOwned:
		msg = "idempotency: the handler called Commit or Rollback on the store's transaction; nothing was stored: return from the handler to commit, return an error to roll back"
	}
	attrs := []slog.Attr{
		slog.String("outcome", string(ev.Outcome)),
		slog.String("method", ev.Method),
		slog.String("path", logPath(ev.Path)),
		slog.Int("status", ev.Status),
		slog.Duration("duration", ev.Duration),
	}
	if ev.Key != "" {
		if e.cfg.LogKeys {
			attrs = append(attrs, slog.String("key", ev.Key))
		} else {
			attrs = append(attrs, slog.String("key_hash", keyHash(ev.Principal, ev.Key)))
		}
	}
	if ev.RequestID != "" {
		attrs = append(attrs, slog.String("request_id", idemstore.BoundRequestID(ev.RequestID)))
	}
	if ev.ClaimLatency > 0 {
		attrs = append(attrs, slog.Duration("claim_latency", ev.ClaimLatency))
	}
	if ev.Wait != "" {
		attrs = append(attrs, slog.String("wait", string(ev.Wait)), slog.Duration("waited", ev.Waited))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	logger.LogAttrs(ctx, level, msg, attrs...)
}

// logPath is the path as logged: without its query string, which may carry
// what the client should not have put in a URL (a card number, a token).
func logPath(p string) string {
	if i := strings.IndexByte(p, '?'); i >= 0 {
		return p[:i]
	}
	return p
}

// keyHash is the key as logged unless Config.LogKeys: the first 16 hex
// digits of SHA-256 over the principal, a NUL and the key. It lets an
// operator correlate the lines of one key without the log holding it.
func keyHash(principal, key string) string { return idemstore.NotifyID(principal, key) }
