package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// statsJSON is the JSON output of Stats. A figure the store does not count
// is null.
type statsJSON struct {
	Store          string          `json:"store"`
	Now            jsonTime        `json:"now"`
	InProgress     idemstore.Count `json:"in_progress"`
	Completed      idemstore.Count `json:"completed"`
	Failed         idemstore.Count `json:"failed"`
	Released       idemstore.Count `json:"released"`
	Stale          int             `json:"stale"`
	Uncertain      int             `json:"uncertain"`
	StaleCapped    bool            `json:"stale_capped"`
	OldestLockedAt jsonTime        `json:"oldest_locked_at"`
	OldestAge      *float64        `json:"oldest_age_seconds"`
	Expired        idemstore.Count `json:"expired"`
}

// Stats writes the store's figures: records by state (idemstore.Store.Stats),
// the stale claims (in progress past their own lease, ListStale, counted
// up to o.Limit) and how many of them have an unknown outcome, the oldest
// lease and its age, and the expired records awaiting a purge. Times and
// ages are the store's clock.
func Stats(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	st, err := o.Store.Stats(ctx, statsStaleAfter)
	if err != nil {
		return err
	}
	stale, err := o.Store.ListStale(ctx, o.Limit)
	if err != nil {
		return err
	}
	uncertain := 0
	for _, r := range stale {
		if r.Uncertain {
			uncertain++
		}
	}
	capped := len(stale) >= o.Limit
	if o.JSON {
		j := statsJSON{Store: o.Name, Now: jsonTime(st.Now), InProgress: st.InProgress, Completed: st.Completed,
			Failed: st.Failed, Released: st.Released, Stale: len(stale), Uncertain: uncertain, StaleCapped: capped,
			OldestLockedAt: jsonTime(st.OldestLockedAt), Expired: st.Expired}
		if !st.OldestLockedAt.IsZero() {
			a := seconds(st.Now.Sub(st.OldestLockedAt))
			j.OldestAge = &a
		}
		return writeJSON(w, j)
	}
	staleNote := " (past their own lease)"
	if capped {
		staleNote = " or more (past their own lease; --limit bounds the count)"
	}
	rows := [][2]string{
		{"store", o.Name},
		{"store clock", utc(st.Now)},
		{"in progress", st.InProgress.String()},
		{"  stale", strconv.Itoa(len(stale)) + staleNote},
	}
	if uncertain > 0 {
		rows = append(rows, [2]string{"  outcome unknown", strconv.Itoa(uncertain) + " of them (resolve with idemctl complete or release --force)"})
	}
	rows = append(rows, [][2]string{
		{"  oldest lock", stamp(st.OldestLockedAt, st.Now)},
		{"completed", st.Completed.String()},
		{"failed", st.Failed.String()},
		{"released", st.Released.String() + " (free again; kept for their nonce)"},
		{"expired", st.Expired.String() + " (awaiting purge)"},
	}...)
	return fields(w, rows)
}

// storeNow returns the store's clock, which every staleness and age is
// measured on: a record's LeaseExpiresAt is the store's, and this
// machine's clock may be off. Get returns no clock, so it asks Stats,
// which on a large SQL table takes as long as stats does.
func storeNow(ctx context.Context, o Options) (time.Time, error) {
	st, err := o.Store.Stats(ctx, statsStaleAfter)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the store's clock: %w", err)
	}
	if st.Now.IsZero() {
		return time.Time{}, errors.New("read the store's clock: the store's Stats reported none")
	}
	return st.Now, nil
}

// UncertainNote is what show and stale say of a record whose outcome is
// unknown (idem.Record.Uncertain).
const UncertainNote = "outcome unknown: an attempt's work may have committed; resolve with idemctl complete or release --force"

// Stale writes the in-progress records past their own lease
// (idemstore.Store.ListStale, Uncertain ones included), the longest expired
// first, at most o.Limit, with their ages on the store's clock.
func Stale(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	recs, err := o.Store.ListStale(ctx, o.Limit)
	if err != nil {
		return err
	}
	if len(recs) == 0 && !o.JSON {
		_, err := fmt.Fprintln(w, "no stale claims (none in progress past its lease)")
		return err
	}
	now, err := storeNow(ctx, o)
	if err != nil {
		return err
	}
	if o.JSON {
		out := make([]recordJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toJSON(r, now, false))
		}
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tREQUEST ID\tLOCKED AT (UTC)\tLEASE ENDED\tOUTCOME")
	uncertain := 0
	for _, r := range recs {
		outcome := "-"
		if r.Uncertain {
			outcome, uncertain = "unknown", uncertain+1
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Principal, r.Key, r.RequestID, utc(r.LockedAt), age(r.LeaseExpiresAt, now), outcome)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if len(recs) == o.Limit {
		more = " (the limit; there may be more: --limit)"
	}
	if _, err := fmt.Fprintf(w, "%d stale claims%s\n", len(recs), more); err != nil {
		return err
	}
	if uncertain > 0 {
		_, err = fmt.Fprintf(w, "%d with %s\n", uncertain, UncertainNote)
	}
	return err
}

// get reads the record for (principal, key); a missing one is an error
// wrapping idemstore.ErrNotFound that names them.
func get(ctx context.Context, o Options, principal, key string) (idem.Record, error) {
	r, err := o.Store.Get(ctx, principal, key)
	if errors.Is(err, idemstore.ErrNotFound) {
		return r, fmt.Errorf("no record for principal %q key %q: %w", principal, key, idemstore.ErrNotFound)
	}
	return r, err
}

// Show writes the record for (principal, key): state and whether its lease
// is live (its LeaseExpiresAt against the store's clock), whether its
// outcome is unknown, fingerprint, request id, lease token, times, and the
// stored status and headers; the body only with o.Body. It returns an error
// wrapping idemstore.ErrNotFound when there is no record.
func Show(ctx context.Context, w io.Writer, o Options, principal, key string) error {
	o.defaults()
	r, err := get(ctx, o, principal, key)
	if err != nil {
		return err
	}
	now, err := storeNow(ctx, o)
	if err != nil {
		return err
	}
	if o.JSON {
		return writeJSON(w, toJSON(r, now, o.Body))
	}
	state := string(r.State)
	switch {
	case !now.Before(r.ExpiresAt):
		state += " (expired: counts as absent, awaiting purge)"
	case r.State == idemstore.StateInProgress && !now.Before(r.LeaseExpiresAt):
		state += " (stale: its lease ended " + age(r.LeaseExpiresAt, now) + ")"
	case r.State == idemstore.StateInProgress:
		state += " (lease live: it ends " + age(r.LeaseExpiresAt, now) + ")"
	}
	rows := [][2]string{
		{"principal", r.Principal},
		{"key", r.Key},
		{"state", state},
	}
	if r.Uncertain {
		rows = append(rows, [2]string{"outcome", strings.TrimPrefix(UncertainNote, "outcome ")})
	}
	rows = append(rows, [][2]string{
		{"fingerprint", fmt.Sprintf("%x", r.Fingerprint)},
		{"request id", r.RequestID},
		{"lease token", r.LeaseToken},
		{"created at", stamp(r.CreatedAt, now)},
		{"locked at", stamp(r.LockedAt, now)},
	}...)
	if r.State == idemstore.StateInProgress {
		rows = append(rows, [2]string{"lease ends", stamp(r.LeaseExpiresAt, now)})
	}
	rows = append(rows, [2]string{"expires at", stamp(r.ExpiresAt, now)})
	if resp := r.Response; resp != nil {
		rows = append(rows, [2]string{"status", strconv.Itoa(resp.Status)})
		names := make([]string, 0, len(resp.Header))
		for n := range resp.Header {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			for _, v := range resp.Header[n] {
				rows = append(rows, [2]string{"header", n + ": " + v})
			}
		}
		b := fmt.Sprintf("%d bytes", len(resp.Body))
		if !o.Body {
			b += " (--body prints it)"
		}
		rows = append(rows, [2]string{"body", b})
	}
	if err := fields(w, rows); err != nil {
		return err
	}
	if o.Body && r.Response != nil {
		if _, err := w.Write(r.Response.Body); err != nil {
			return err
		}
		if n := len(r.Response.Body); n > 0 && r.Response.Body[n-1] != '\n' {
			_, err = io.WriteString(w, "\n")
			return err
		}
	}
	return nil
}

// ForceRisk is what --force risks on a live lease, which Release says when
// it refuses one and when it is forced to release one.
const ForceRisk = "its holder may still be running: a retry can then run the handler again while the holder runs, " +
	"so effects outside the store (a provider call, an email) may happen twice; the holder's settle then " +
	"misses its fence (on a SQL store its own writes roll back)"

// UncertainRisk is what --force risks on a record whose outcome is
// unknown, which Release says when it refuses one and when it is forced to
// release one.
const UncertainRisk = "its outcome is unknown: an attempt's work may have committed without its stored response; " +
	"released, the key is free and the next retry runs the handler again, which may take effect a second time " +
	"(a second charge, a second email). Release it only when you know that no attempt took effect; " +
	"if one did, store its response with idemctl complete"

// Release marks the in-progress record for (principal, key) released
// (idemstore.Store.Release): it deletes nothing; the key is free for the next
// retry, which runs the handler afresh, and the record keeps its nonce
// until it expires. The release is fenced by the lease token it read: if
// the holder settles, or a retry takes the key over, after the read, it
// releases nothing and returns an error wrapping ErrRefused. It refuses a
// settled record; a live lease (LeaseExpiresAt after the store's clock)
// and a record whose outcome is unknown (Uncertain) it refuses unless
// o.Force, and says what that risks. It asks for confirmation (o.Confirm)
// unless o.Yes; o.DryRun says what it would do and does nothing.
func Release(ctx context.Context, w io.Writer, o Options, principal, key string) error {
	o.defaults()
	r, err := get(ctx, o, principal, key)
	if err != nil {
		return err
	}
	if r.State == idemstore.StateReleased {
		return fmt.Errorf("%w: %s/%s is released already: its key is free", ErrRefused, principal, key)
	}
	if r.State != idemstore.StateInProgress {
		return fmt.Errorf("%w: %s/%s is %s: only an in-progress claim is released (a stored outcome is replayed until it expires)",
			ErrRefused, principal, key, r.State)
	}
	now, err := storeNow(ctx, o)
	if err != nil {
		return err
	}
	live := now.Before(r.LeaseExpiresAt)
	var risks []string
	if live {
		risks = append(risks, fmt.Sprintf("the lease is live (it ends %s); %s", age(r.LeaseExpiresAt, now), ForceRisk))
	}
	if r.Uncertain {
		risks = append(risks, UncertainRisk)
	}
	if len(risks) > 0 && !o.Force {
		return fmt.Errorf("%w: %s/%s: %s. Pass --force to release it anyway", ErrRefused, principal, key, strings.Join(risks, "; and "))
	}
	lease := "lease ended " + age(r.LeaseExpiresAt, now)
	if live {
		lease = "lease live, it ends " + age(r.LeaseExpiresAt, now)
	}
	outcome := ""
	if r.Uncertain {
		outcome = ", outcome unknown"
	}
	what := fmt.Sprintf("%s/%s (in progress, locked %s, %s%s, request id %s, lease token %s)",
		principal, key, age(r.LockedAt, now), lease, outcome, r.RequestID, r.LeaseToken)
	result := map[string]any{"principal": principal, "key": key, "request_id": r.RequestID,
		"lease_token": r.LeaseToken, "locked_at": jsonTime(r.LockedAt), "lease_expires_at": jsonTime(r.LeaseExpiresAt),
		"live_lease": live, "uncertain": r.Uncertain}
	if o.DryRun {
		result["released"], result["dry_run"] = false, true
		if o.JSON {
			return writeJSON(w, result)
		}
		_, err := fmt.Fprintf(w, "would release %s\n", what)
		return err
	}
	question := "Release " + what + "? The key is then free: the next retry runs the handler afresh."
	if len(risks) > 0 {
		question = "FORCE: " + strings.Join(risks, "; and ") + ". " + question
	}
	if err := o.confirm(question); err != nil {
		return err
	}
	err = o.Store.Release(ctx, idemstore.Lease{Principal: principal, Key: key, Token: r.LeaseToken})
	if errors.Is(err, idemstore.ErrLeaseLost) {
		return fmt.Errorf("%w: %s/%s changed since it was read (its holder settled, or a retry took it over): nothing released",
			ErrRefused, principal, key)
	}
	if err != nil {
		return err
	}
	result["released"] = true
	if o.JSON {
		return writeJSON(w, result)
	}
	_, err = fmt.Fprintf(w, "released %s: the key is free for the next retry\n", what)
	return err
}

// purgeBatch and purgeMaxBatches bound one Purge: at most 100 000 records.
const (
	purgeBatch      = 500
	purgeMaxBatches = 200
)

// Purge deletes the expired records (idemstore.Store.PurgeExpired in batches of
// 500, until a batch deletes nothing). It counts them first (Stats) and
// asks for confirmation unless o.Yes; o.DryRun only counts.
func Purge(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	st, err := o.Store.Stats(ctx, statsStaleAfter)
	if err != nil {
		return err
	}
	if o.DryRun {
		if o.JSON {
			return writeJSON(w, map[string]any{"expired": st.Expired, "purged": 0, "dry_run": true})
		}
		_, err := fmt.Fprintf(w, "would purge %s expired records\n", st.Expired)
		return err
	}
	if st.Expired == 0 {
		if o.JSON {
			return writeJSON(w, map[string]any{"expired": st.Expired, "purged": 0})
		}
		_, err := fmt.Fprintln(w, "nothing to purge: no expired records")
		return err
	}
	if err := o.confirm(fmt.Sprintf("purge %s expired records from %s?", st.Expired, o.Name)); err != nil {
		return err
	}
	total := 0
	for range purgeMaxBatches {
		n, err := o.Store.PurgeExpired(ctx, purgeBatch)
		total += n
		if err != nil {
			return fmt.Errorf("purged %d, then: %w", total, err)
		}
		if n == 0 {
			break
		}
	}
	if o.JSON {
		return writeJSON(w, map[string]any{"expired": st.Expired, "purged": total})
	}
	_, err = fmt.Fprintf(w, "purged %d expired records\n", total)
	return err
}
