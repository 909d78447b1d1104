package ctl

// This file is the reconcile command on its own. core's Sweeper now
// reconciles through an Engine's Config.Reconcile, but reports counts, not
// the per-claim actions and dry run an operator needs here.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	idem "github.com/idemgo/idem/core"
)

// ReconcileRequest is what Reconcile POSTs to the reconciler URL for each
// stale claim.
type ReconcileRequest struct {
	Principal string    `json:"principal"`
	Key       string    `json:"key"`
	RequestID string    `json:"request_id"`
	LockedAt  time.Time `json:"locked_at"`
	// Nonce is the record's nonce (empty on Redis): with the principal and
	// the key it gives the crashed attempt's downstream keys
	// (idem.DownstreamKeyOf), which the reconciler looks the effect up by.
	Nonce string `json:"nonce"`
	// DownstreamKeys holds, for each step of Options.Steps (--steps), the
	// key idem.DownstreamKey gave the crashed attempt for it.
	DownstreamKeys map[string]string `json:"downstream_keys,omitempty"`
}

// ReconcileAnswer is the reconciler's 200 answer: the response the stale
// attempt's effect amounts to, to be stored and replayed. A 404 answer
// means the attempt had no effect.
type ReconcileAnswer struct {
	Status  int         `json:"status"`
	Headers http.Header `json:"headers"`
	Body    string      `json:"body"`
}

// What Reconcile did with one stale claim.
const (
	ActionStored   = "stored"   // the answer was stored as the outcome: retries replay it
	ActionReleased = "released" // no effect: the claim was released, a retry runs afresh
	ActionChanged  = "changed"  // the record changed meanwhile (settled, taken over): left alone
	ActionManual   = "manual"   // the reconciler could not tell: needs manual resolution
)

// reconciled is one line of Reconcile's report.
type reconciled struct {
	Principal string `json:"principal"`
	Key       string `json:"key"`
	RequestID string `json:"request_id"`
	Action    string `json:"action"`
	DryRun    bool   `json:"dry_run,omitempty"`
	Status    int    `json:"status,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// Reconcile makes one pass over the stale claims (ListStale with o.Lease,
// at most o.Limit). For each it takes the claim over as the engine does
// (Store.Claim with the record's fingerprint: fenced, and only while the
// lease is still expired), so no retry runs the handler meanwhile, then
// POSTs a ReconcileRequest to o.URL:
//
//   - 200 with a ReconcileAnswer: the answer is classified like a
//     handler's response (idem.DefaultClassifier) and stored as completed or
//     failed, so retries replay it; a status the classifier releases (5xx,
//     408, 429) releases the claim;
//   - 404: the attempt had no effect; the claim is released, and a retry
//     runs the handler afresh;
//   - anything else, or no answer: the claim is left in progress under
//     the new lease (stale again after o.Lease) and reported as needing
//     manual resolution.
//
// With o.DryRun it asks the URL and reports what it would do, changing
// nothing. The report lists each claim and its action.
func Reconcile(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	if o.URL == "" && !o.DryRun {
		return fmt.Errorf("%w: reconcile needs --url (the reconciler to ask), or --dry-run", ErrUsage)
	}
	stale, err := o.Store.ListStale(ctx, o.Lease, o.Limit)
	if err != nil {
		return err
	}
	var report []reconciled
	for _, r := range stale {
		rep, err := reconcileOne(ctx, o, r)
		if err != nil {
			return fmt.Errorf("reconcile %s/%s: %w", r.Principal, r.Key, err)
		}
		report = append(report, rep)
	}
	if o.JSON {
		if report == nil {
			report = []reconciled{}
		}
		return writeJSON(w, report)
	}
	if len(report) == 0 {
		_, err := fmt.Fprintf(w, "no stale claims (none in progress for %v or more)\n", o.Lease)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tREQUEST ID\tACTION\tDETAIL")
	for _, r := range report {
		action := r.Action
		if r.DryRun {
			action = "would be " + action
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Principal, r.Key, r.RequestID, action, r.Detail)
	}
	return tw.Flush()
}

// reconcileOne handles one stale record. A returned error is a store error;
// the reconciler's failures are reported as ActionManual.
func reconcileOne(ctx context.Context, o Options, r idem.Record) (reconciled, error) {
	rep := reconciled{Principal: r.Principal, Key: r.Key, RequestID: r.RequestID, DryRun: o.DryRun}
	lease := idem.Lease{Principal: r.Principal, Key: r.Key, Token: r.LeaseToken}
	if !o.DryRun {
		// Take the claim over, as the engine does before it asks
		// Config.Reconcile: fenced by the store, and only while the lease
		// is still expired.
		// A takeover keeps the record's nonce; the store still wants one
		// for the case it answers by replacing an expired record.
		var b [32]byte
		_, _ = rand.Read(b[:])
		req := idem.ClaimRequest{Principal: r.Principal, Key: r.Key, Fingerprint: r.Fingerprint,
			Token: hex.EncodeToString(b[:16]), Nonce: hex.EncodeToString(b[16:]), RequestID: r.RequestID,
			Lease: o.Lease, Retention: o.Retention}
		res, err := o.Store.Claim(ctx, req)
		if err != nil {
			return rep, err
		}
		if !res.Claimed || !res.Reclaimed {
			if res.Claimed { // it had expired and counted as absent: give it back
				_ = o.Store.Release(ctx, idem.Lease{Principal: r.Principal, Key: r.Key, Token: req.Token})
			}
			rep.Action, rep.Detail = ActionChanged, "the record changed since it was listed (settled, released or taken over); left alone"
			return rep, nil
		}
		lease.Token = req.Token
	}
	if o.URL == "" {
		rep.Action, rep.Detail = ActionManual, "no --url to ask"
		return rep, nil
	}
	answer, found, err := ask(ctx, o, r)
	switch {
	case err != nil:
		rep.Action, rep.Detail = ActionManual, err.Error()+"; claim left in progress"
		return rep, nil
	case !found:
		rep.Action, rep.Detail = ActionReleased, "reconciler: no effect (404)"
		if !o.DryRun {
			if err := o.Store.Release(ctx, lease); err != nil {
				return rep, releaseErr(&rep, err)
			}
		}
		return rep, nil
	}
	rep.Status = answer.Status
	var state idem.State
	switch idem.DefaultClassifier(answer.Status, nil) {
	case idem.Complete:
		state = idem.StateCompleted
	case idem.Fail:
		state = idem.StateFailed
	default:
		rep.Action, rep.Detail = ActionReleased, fmt.Sprintf("reconciler: status %d is not stored (a retry runs afresh)", answer.Status)
		if !o.DryRun {
			if err := o.Store.Release(ctx, lease); err != nil {
				return rep, releaseErr(&rep, err)
			}
		}
		return rep, nil
	}
	rep.Action, rep.Detail = ActionStored, fmt.Sprintf("reconciler: %d, stored as %s", answer.Status, state)
	if o.DryRun {
		return rep, nil
	}
	header := answer.Headers
	if header == nil {
		header = http.Header{}
	}
	_, tx, err := o.Store.BeginTx(ctx, lease)
	if err != nil {
		return rep, err
	}
	err = tx.Settle(ctx, idem.Outcome{State: state, Response: idem.Response{Status: answer.Status, Header: header, Body: []byte(answer.Body)}})
	_ = tx.Rollback(ctx)
	if err != nil {
		return rep, releaseErr(&rep, err)
	}
	return rep, nil
}

// releaseErr reports a lost lease as ActionChanged; other errors are
// returned.
func releaseErr(rep *reconciled, err error) error {
	if errors.Is(err, idem.ErrLeaseLost) {
		rep.Action, rep.Detail = ActionChanged, "the lease was lost meanwhile; left alone"
		return nil
	}
	return err
}

// ask POSTs r to the reconciler. found is false for a 404.
func ask(ctx context.Context, o Options, r idem.Record) (ans ReconcileAnswer, found bool, err error) {
	q := ReconcileRequest{Principal: r.Principal, Key: r.Key, RequestID: r.RequestID, LockedAt: r.LockedAt.UTC(), Nonce: r.Nonce}
	for _, step := range o.Steps {
		if q.DownstreamKeys == nil {
			q.DownstreamKeys = make(map[string]string, len(o.Steps))
		}
		q.DownstreamKeys[step] = idem.DownstreamKeyOf(r.Principal, r.Key, r.Nonce, step)
	}
	body, _ := json.Marshal(q)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL, bytes.NewReader(body))
	if err != nil {
		return ans, false, fmt.Errorf("reconciler: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.HTTPClient.Do(req)
	if err != nil {
		return ans, false, fmt.Errorf("reconciler: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return ans, false, fmt.Errorf("reconciler: reading the answer: %v", err)
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return ans, false, nil
	case http.StatusOK:
		if err := json.Unmarshal(raw, &ans); err != nil || ans.Status < 100 || ans.Status > 599 {
			return ans, false, fmt.Errorf("reconciler: 200 without a valid {status, headers, body} answer")
		}
		return ans, true, nil
	}
	return ans, false, fmt.Errorf("reconciler answered %d", resp.StatusCode)
}
