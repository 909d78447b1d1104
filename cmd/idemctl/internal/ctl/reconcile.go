package ctl

// This file is the reconcile command on its own. core's Sweeper reconciles
// through an Engine's Config.Reconcile, but reports counts, not the
// per-claim actions and dry run an operator needs here.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// ReconcileRequest is what Reconcile POSTs to the reconciler URL for each
// stale claim.
type ReconcileRequest struct {
	Principal string    `json:"principal"`
	Key       string    `json:"key"`
	RequestID string    `json:"request_id"`
	LockedAt  time.Time `json:"locked_at"`
	// Uncertain says that the record's outcome is unknown: an attempt's
	// work may have committed without its stored response
	// (idem.Record.Uncertain).
	Uncertain bool `json:"uncertain"`
	// Nonce is the record's nonce (empty on Redis): with the principal and
	// the key it gives the crashed attempt's downstream keys
	// (idem.DownstreamKeyOf), which the reconciler looks the effect up by.
	Nonce string `json:"nonce"`
	// DownstreamKeys holds, for each step of Options.Steps (--steps), the
	// key idem.DownstreamKey gave the crashed attempt for it.
	DownstreamKeys map[string]string `json:"downstream_keys,omitempty"`
}

// The effects a ReconcileAnswer reports.
const (
	// EffectNone says the attempt had no effect: the claim is released
	// and the client's retry runs the handler afresh.
	EffectNone = "none"
	// EffectCompleted says the attempt took effect, and the answer's
	// status, headers and body are the response to replay: they are
	// stored.
	EffectCompleted = "completed"
)

// ReconcileAnswer is the reconciler's answer: HTTP 200 with Content-Type
// application/json and one JSON object with no other member, either
//
//	{"effect": "none"}
//	{"effect": "completed", "status": 201, "headers": {"Content-Type": ["application/json"]}, "body": "<base64>"}
//
// Anything else (another HTTP status, 404 included, a redirect, another
// content type, a malformed or unknown object, no answer in time) is no
// answer: the claim is kept.
type ReconcileAnswer struct {
	Effect  string      `json:"effect"`
	Status  int         `json:"status,omitempty"`
	Headers http.Header `json:"headers,omitempty"`
	Body    []byte      `json:"body,omitempty"` // standard base64 in JSON
}

// maxAnswer bounds the reconciler's answer: a MaxBody body in base64 and
// its headers.
const maxAnswer = 2 << 20

// What Reconcile did with one stale claim.
const (
	ActionStored   = "stored"   // the answer was stored as the outcome: retries replay it
	ActionReleased = "released" // no effect: the claim was released, a retry runs afresh
	ActionChanged  = "changed"  // the record changed meanwhile (settled, taken over): left alone
	ActionKept     = "kept"     // no valid answer: the claim is kept, Uncertain, and the pass stopped
)

// reconciled is one line of Reconcile's report.
type reconciled struct {
	Principal string `json:"principal"`
	Key       string `json:"key"`
	RequestID string `json:"request_id"`
	Uncertain bool   `json:"uncertain"`
	Action    string `json:"action"`
	DryRun    bool   `json:"dry_run,omitempty"`
	Status    int    `json:"status,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// Reconcile makes one pass over the stale claims (ListStale, at most
// o.Limit, Uncertain ones included). For each it takes the claim over as
// the engine does (see takeOver), so no retry runs the handler meanwhile,
// then POSTs a ReconcileRequest to o.URL, without following redirects
// and within o.AskTimeout, and acts on the ReconcileAnswer:
//
//   - effect "none": the claim is released, and the retry runs the handler
//     afresh;
//   - effect "completed": the response is checked and stored as a stored
//     response is (see Complete: completed or failed by
//     idem.DefaultClassifier, headers valid and those of o.StoredHeaders,
//     the body as o.StoredBody says), so retries replay it;
//   - no valid answer: the claim is kept (Store.Keep: in progress,
//     Uncertain, its lease ended), the pass stops there, and Reconcile
//     returns an error wrapping ErrReconciler. The kept claim goes to the
//     end of the stale list, so the next pass asks about the others first.
//
// With o.DryRun it asks the URL and reports what it would do, without the
// takeover and changing nothing. The report lists each claim and its
// action.
func Reconcile(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	if err := checkURL(o.URL); err != nil {
		return err
	}
	if err := o.checkPolicy(); err != nil {
		return err
	}
	stale, err := o.Store.ListStale(ctx, o.Limit)
	if err != nil {
		return err
	}
	var report []reconciled
	var stop error
	for _, r := range stale {
		rep, err := reconcileOne(ctx, o, r)
		if rep.Action != "" {
			report = append(report, rep)
		}
		if err != nil {
			stop = fmt.Errorf("reconcile %s/%s: %w", r.Principal, r.Key, err)
			break
		}
	}
	if err := writeReport(w, o, report); err != nil {
		return errors.Join(stop, err)
	}
	return stop
}

func writeReport(w io.Writer, o Options, report []reconciled) error {
	if o.JSON {
		if report == nil {
			report = []reconciled{}
		}
		return writeJSON(w, report)
	}
	if len(report) == 0 {
		_, err := fmt.Fprintln(w, "no stale claims (none in progress past its lease)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tREQUEST ID\tOUTCOME\tACTION\tDETAIL")
	for _, r := range report {
		action := r.Action
		if r.DryRun {
			action = "would be " + action
		}
		outcome := "-"
		if r.Uncertain {
			outcome = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Principal, r.Key, r.RequestID, outcome, action, r.Detail)
	}
	return tw.Flush()
}

// checkURL refuses a reconciler URL that is not http or https with a host.
func checkURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("%w: reconcile needs --url (the reconciler to ask)", ErrUsage)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: --url %q: want an http:// or https:// URL", ErrUsage, redactURL(raw))
	}
	return nil
}

// redactURL drops a password from a URL for messages.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}

// reconcileOne handles one stale record. An error stops the pass: a store
// error, or one wrapping ErrReconciler after the claim was kept.
func reconcileOne(ctx context.Context, o Options, r idem.Record) (reconciled, error) {
	rep := reconciled{Principal: r.Principal, Key: r.Key, RequestID: r.RequestID, Uncertain: r.Uncertain, DryRun: o.DryRun}
	var lease idemstore.Lease
	if !o.DryRun {
		var ok bool
		var err error
		lease, ok, err = takeOver(ctx, o, r, o.AskTimeout+holdMargin)
		if err != nil {
			return reconciled{}, err
		}
		if !ok {
			rep.Action, rep.Detail = ActionChanged, "the record changed since it was listed (settled, released or taken over); left alone"
			return rep, nil
		}
	}
	kept := func(err error) (reconciled, error) {
		rep.Action, rep.Detail = ActionKept, err.Error()+"; the pass stops"
		if !o.DryRun {
			rep.Detail = err.Error() + "; the claim is kept (outcome unknown), the pass stops"
			err = errors.Join(err, keep(ctx, o, lease))
		}
		return rep, err
	}
	ans, err := ask(ctx, o, r)
	if err != nil {
		return kept(err)
	}
	if ans.Effect == EffectNone {
		rep.Action, rep.Detail = ActionReleased, "reconciler: no effect"
		if o.DryRun {
			return rep, nil
		}
		err := o.Store.Release(ctx, lease)
		if errors.Is(err, idemstore.ErrLeaseLost) {
			rep.Action, rep.Detail = ActionChanged, "the lease was lost meanwhile; left alone"
			return rep, nil
		}
		if err != nil {
			// The release may not have happened: keep the claim rather
			// than leave it held by idemctl's lease.
			return kept(fmt.Errorf("release: %w", err))
		}
		return rep, nil
	}
	state, resp, dropped, err := o.storable(idem.Response{Status: ans.Status, Header: ans.Headers, Body: ans.Body}, false)
	if err != nil {
		return kept(fmt.Errorf("%w: %w", ErrReconciler, err))
	}
	rep.Status = ans.Status
	rep.Action, rep.Detail = ActionStored, fmt.Sprintf("reconciler: %d, stored as %s", ans.Status, state)
	if o.StoredBody == StoredBodyOmit && len(ans.Body) > 0 {
		rep.Detail += " without its body (--stored-body=omit)"
	}
	if len(dropped) > 0 {
		rep.Detail += " without " + strings.Join(dropped, ", ") + " (not in --stored-headers)"
	}
	if o.DryRun {
		return rep, nil
	}
	if err := settle(ctx, o, lease, state, resp); errors.Is(err, errChanged) {
		rep.Action, rep.Detail = ActionChanged, "the lease was lost meanwhile; left alone"
		return rep, nil
	} else if err != nil {
		rep.Action, rep.Detail = ActionKept, err.Error()+"; the claim is kept (outcome unknown), the pass stops"
		return rep, err
	}
	return rep, nil
}

// ask POSTs r to the reconciler and returns its answer, or an error
// wrapping ErrReconciler when it gave none that is valid.
func ask(ctx context.Context, o Options, r idem.Record) (ReconcileAnswer, error) {
	var ans ReconcileAnswer
	q := ReconcileRequest{Principal: r.Principal, Key: r.Key, RequestID: r.RequestID, LockedAt: r.LockedAt.UTC(),
		Uncertain: r.Uncertain, Nonce: r.Nonce}
	for _, step := range o.Steps {
		if q.DownstreamKeys == nil {
			q.DownstreamKeys = make(map[string]string, len(o.Steps))
		}
		q.DownstreamKeys[step] = idem.DownstreamKeyOf(r.Principal, r.Key, r.Nonce, step)
	}
	body, err := json.Marshal(q)
	if err != nil {
		return ans, fmt.Errorf("%w: encode the request: %v", ErrReconciler, err)
	}
	actx, cancel := context.WithTimeout(ctx, o.AskTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, o.URL, bytes.NewReader(body))
	if err != nil {
		return ans, fmt.Errorf("%w: %v", ErrReconciler, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	// A redirect would send the principal, the key and the nonce to
	// another URL, and its answer would be another's: never followed.
	client := *o.HTTPClient
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its URL is --url, which the message names once
		}
		return ans, fmt.Errorf("%w: no answer: %v", ErrReconciler, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return ans, fmt.Errorf("%w: reading the answer: %v", ErrReconciler, err)
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return ans, fmt.Errorf("%w: answered %s to %s (a redirect is not followed)", ErrReconciler, resp.Status, resp.Header.Get("Location"))
	case resp.StatusCode != http.StatusOK:
		return ans, fmt.Errorf("%w: answered %s, not 200 with an effect (a 404 is no answer either)", ErrReconciler, resp.Status)
	case len(raw) > maxAnswer:
		return ans, fmt.Errorf("%w: the answer is larger than %d bytes", ErrReconciler, maxAnswer)
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return ans, fmt.Errorf("%w: the answer's Content-Type is %q, not application/json", ErrReconciler, resp.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil {
		return ans, fmt.Errorf("%w: the answer is not a valid effect object: %v", ErrReconciler, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return ans, fmt.Errorf("%w: the answer has more than one JSON value", ErrReconciler)
	}
	switch ans.Effect {
	case EffectNone:
		if ans.Status != 0 || ans.Headers != nil || ans.Body != nil {
			return ans, fmt.Errorf("%w: effect none with a response: which is it?", ErrReconciler)
		}
	case EffectCompleted:
		if ans.Status == 0 {
			return ans, fmt.Errorf("%w: effect completed without a status", ErrReconciler)
		}
	default:
		return ans, fmt.Errorf("%w: unknown effect %q (want none or completed)", ErrReconciler, ans.Effect)
	}
	return ans, nil
}
