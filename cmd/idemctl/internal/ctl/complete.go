package ctl

// This file is what complete and reconcile share: checking a response as
// the engine checks one it stores, the fenced takeover, and storing the
// outcome under it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/idemstore"
)

// holdMargin is how long, beyond the reconciler's time, a takeover's lease
// lasts: complete and reconcile hold the record for the store calls after
// the takeover, and nobody else takes it over meanwhile. If idemctl dies
// holding it, the record is stale again once the lease ends.
const holdMargin = time.Minute

// errNoBodyPolicy is the refusal of complete and reconcile without
// Options.StoredBody.
var errNoBodyPolicy = fmt.Errorf("%w: --stored-body is required: idemctl cannot seal a body as the application's Config.BodySealer does; "+
	"pass --stored-body=plain if the application stores bodies as they are (no BodySealer), or --stored-body=omit "+
	"if it seals them or sets OmitStoredBody (a replay then sends the status and headers with an empty body)", ErrUsage)

// checkPolicy checks o.StoredBody and o.StoredHeaders, as Config's
// validation checks StoredHeaders. A dry run stores nothing, so it needs no
// StoredBody: it shows the body as given.
func (o *Options) checkPolicy() error {
	if o.DryRun && o.StoredBody == "" {
		o.StoredBody = StoredBodyPlain
	}
	switch o.StoredBody {
	case StoredBodyPlain, StoredBodyOmit:
	case "":
		return errNoBodyPolicy
	default:
		return fmt.Errorf("%w: --stored-body %q: want plain or omit", ErrUsage, o.StoredBody)
	}
	for _, h := range o.StoredHeaders {
		if !idemadapter.ValidHeaderFieldName(h) {
			return fmt.Errorf("%w: --stored-headers: %q is not a header name", ErrUsage, h)
		}
		for _, s := range idem.SensitiveHeaders {
			if strings.EqualFold(h, s) {
				return fmt.Errorf("%w: --stored-headers names %s: idemctl does not store a session or a credential for a replay to hand out", ErrUsage, s)
			}
		}
	}
	return nil
}

// errResponse marks a response that cannot be stored.
var errResponse = errors.New("response cannot be stored")

// storable checks resp as the engine checks a handler's response before
// it stores it, and returns the state its status is stored as
// (idem.DefaultClassifier: completed for 2xx and 3xx, failed for 4xx) and
// the response to store: its headers those of o.StoredHeaders,
// canonicalised (strict refuses any other; otherwise they are left out,
// as the engine leaves them out, and named in dropped), each a valid
// field; its body as o.StoredBody says, at most MaxBody bytes. A status
// the engine would not store (1xx, 5xx, 408, 425, 429: it releases the
// key) is refused: the effect happened, so releasing would run it again.
// Errors wrap errResponse.
func (o *Options) storable(resp idem.Response, strict bool) (state idemstore.State, out idem.Response, dropped []string, err error) {
	if resp.Status < 200 || resp.Status > 599 {
		return "", out, nil, fmt.Errorf("%w: status %d is not a final HTTP status", errResponse, resp.Status)
	}
	switch idem.DefaultClassifier(resp.Status, nil) {
	case idem.Complete:
		state = idemstore.StateCompleted
	case idem.Fail:
		state = idemstore.StateFailed
	default:
		return "", out, nil, fmt.Errorf("%w: status %d is one the engine releases rather than stores (5xx, 408, 425, 429); "+
			"if the attempt had no effect, release the key instead", errResponse, resp.Status)
	}
	allowed := make(map[string]bool, len(o.StoredHeaders))
	for _, h := range o.StoredHeaders {
		allowed[http.CanonicalHeaderKey(h)] = true
	}
	out = idem.Response{Status: resp.Status, Header: http.Header{}}
	for name, values := range resp.Header {
		// A stored value is replayed, perhaps by a server that writes
		// values raw: one with CR or LF would split the replay.
		if !idemadapter.ValidHeaderField(name, values) {
			return "", out, nil, fmt.Errorf("%w: header %q has an invalid name or a value with a control character", errResponse, name)
		}
		cn := http.CanonicalHeaderKey(name)
		if !allowed[cn] {
			if strict {
				return "", out, nil, fmt.Errorf("%w: header %s is not in --stored-headers (%s), so the application would not have stored it",
					errResponse, cn, strings.Join(o.StoredHeaders, ","))
			}
			dropped = append(dropped, cn)
			continue
		}
		out.Header[cn] = append(out.Header[cn], values...)
	}
	slices.Sort(dropped)
	if len(resp.Body) > MaxBody {
		return "", out, nil, fmt.Errorf("%w: the body has %d bytes, more than %d", errResponse, len(resp.Body), MaxBody)
	}
	if o.StoredBody == StoredBodyPlain {
		out.Body = resp.Body
	}
	return state, out, dropped, nil
}

// newTokenAndNonce returns a new lease token and nonce, as the engine
// makes them.
func newTokenAndNonce() (token, nonce string) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
}

// takeOver claims the stale record r as the engine does before it asks
// Config.Reconcile: Store.Claim with r's fingerprint, a new token and
// TakeOverUncertain, which the store grants only while r is in progress
// past its lease, so no retry runs the handler while idemctl holds it, and
// a holder that settled meanwhile wins. ok is false when the record
// changed since it was read (settled, released, taken over, expired): then
// nothing is held. The takeover keeps the record's nonce and its Uncertain
// mark.
func takeOver(ctx context.Context, o Options, r idem.Record, hold time.Duration) (lease idemstore.Lease, ok bool, err error) {
	token, nonce := newTokenAndNonce()
	lease = idemstore.Lease{Principal: r.Principal, Key: r.Key, Token: token}
	res, err := o.Store.Claim(ctx, idemstore.ClaimRequest{Principal: r.Principal, Key: r.Key, Fingerprint: r.Fingerprint,
		Token: token, Nonce: nonce, RequestID: r.RequestID, Lease: hold, Retention: o.Retention,
		TakeOverUncertain: true, Durable: true})
	if err != nil {
		// The claim may have committed with its answer lost: keep it, as
		// the engine keeps a lost takeover (never released).
		return lease, false, errors.Join(fmt.Errorf("take over: %w", err), keep(ctx, o, lease))
	}
	if res.Claimed && !res.Reclaimed {
		// It had expired or been released, and counted as absent: this
		// claim is a new one that stored nothing; give it back.
		if err := o.Store.Release(ctx, lease); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
			return lease, false, fmt.Errorf("give back a claim of a record that changed: %w", err)
		}
	}
	return lease, res.Reclaimed, nil
}

// keep ends a takeover whose outcome is still unknown (Store.Keep): the
// record stays in progress, Uncertain, its lease ended, for the next
// reconcile, a retry's Config.Reconcile or an operator. It has its own
// time, so a command cancelled or past its --timeout still keeps the
// claim. A lost lease is no error: the record is someone else's.
func keep(ctx context.Context, o Options, lease idemstore.Lease) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := o.Store.Keep(kctx, lease); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		return fmt.Errorf("keep: %w", err)
	}
	return nil
}

// errChanged marks a takeover or a settle that lost its fence: the record
// changed meanwhile and is left as it is.
var errChanged = errors.New("the record changed meanwhile")

// settle stores resp as the outcome under lease, as the engine does with
// Reconcile's answer (BeginTx, Settle). A lost fence returns errChanged;
// any other failure keeps the claim (the effect happened: a release would
// run it again) and is returned.
func settle(ctx context.Context, o Options, lease idemstore.Lease, state idemstore.State, resp idem.Response) error {
	_, tx, err := o.Store.BeginTx(ctx, lease)
	if err != nil {
		return errors.Join(fmt.Errorf("begin: %w", err), keep(ctx, o, lease))
	}
	err = tx.Settle(ctx, idemstore.Outcome{State: state, Response: resp})
	rerr := tx.Rollback(context.WithoutCancel(ctx)) // a no-op after a Settle that committed
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idemstore.ErrLeaseLost):
		return errChanged
	}
	if rerr != nil && !errors.Is(err, rerr) {
		err = errors.Join(err, rerr)
	}
	// The commit's answer may have been lost after it committed: the
	// fenced Keep then misses, and the outcome stands.
	return errors.Join(fmt.Errorf("settle: %w", err), keep(ctx, o, lease))
}

// Complete resolves the record for (principal, key) by storing resp as its
// outcome: for an attempt that took effect (the provider charged the card)
// but whose response was not stored, typically one whose outcome is
// unknown (Uncertain), or a stale claim. It takes the record over with the
// engine's fenced takeover (see takeOver), then stores resp as the engine
// stores Reconcile's answer: completed for 2xx and 3xx, failed for 4xx
// (idem.DefaultClassifier), its headers o.StoredHeaders' (any other is
// refused), its body as o.StoredBody says. Retries then replay it instead
// of running the handler. It refuses a record that is not in progress, and
// one whose lease is live (its holder may still settle). It asks for
// confirmation unless o.Yes; o.DryRun says what it would store.
func Complete(ctx context.Context, w io.Writer, o Options, principal, key string, resp idem.Response) error {
	o.defaults()
	if err := o.checkPolicy(); err != nil {
		return err
	}
	state, out, _, err := o.storable(resp, true)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	r, err := get(ctx, o, principal, key)
	if err != nil {
		return err
	}
	now, err := storeNow(ctx, o)
	if err != nil {
		return err
	}
	switch {
	case r.State == idemstore.StateReleased:
		return fmt.Errorf("%w: %s/%s is released: its key is free and the next retry runs afresh; nothing to complete", ErrRefused, principal, key)
	case r.State != idemstore.StateInProgress:
		return fmt.Errorf("%w: %s/%s is %s already: its stored outcome is replayed", ErrRefused, principal, key, r.State)
	case !now.Before(r.ExpiresAt):
		return fmt.Errorf("%w: %s/%s has expired and counts as absent: the next retry runs afresh", ErrRefused, principal, key)
	case now.Before(r.LeaseExpiresAt):
		return fmt.Errorf("%w: %s/%s holds a live lease (it ends %s): its holder may still store its own outcome; "+
			"wait until the lease has ended", ErrRefused, principal, key, age(r.LeaseExpiresAt, now))
	}
	outcome := "stale"
	if r.Uncertain {
		outcome = "outcome unknown"
	}
	what := fmt.Sprintf("%d as the %s outcome of %s/%s (in progress, %s, request id %s; %d header fields, %d body bytes)",
		out.Status, state, principal, key, outcome, r.RequestID, len(out.Header), len(out.Body))
	result := map[string]any{"principal": principal, "key": key, "request_id": r.RequestID, "status": out.Status,
		"state": state, "uncertain": r.Uncertain, "body_bytes": len(out.Body)}
	if o.DryRun {
		result["stored"], result["dry_run"] = false, true
		if o.JSON {
			return writeJSON(w, result)
		}
		_, err := fmt.Fprintf(w, "would store %s\n", what)
		return err
	}
	if err := o.confirm("Store " + what + "? Retries then replay it and the handler does not run again."); err != nil {
		return err
	}
	lease, ok, err := takeOver(ctx, o, r, holdMargin)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s/%s changed since it was read (its holder settled, or a retry took it over): nothing stored",
			ErrRefused, principal, key)
	}
	if err := settle(ctx, o, lease, state, out); errors.Is(err, errChanged) {
		return fmt.Errorf("%w: %s/%s was taken from idemctl before it stored the outcome: nothing stored", ErrRefused, principal, key)
	} else if err != nil {
		return fmt.Errorf("%s/%s: %w (the claim is kept, outcome unknown: show it, then complete it again)", principal, key, err)
	}
	result["stored"] = true
	if o.JSON {
		return writeJSON(w, result)
	}
	_, err = fmt.Fprintf(w, "stored %s: retries replay it\n", what)
	return err
}
