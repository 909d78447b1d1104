package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	idem "github.com/idemgo/idem/core"
)

// statsJSON is the JSON output of Stats. A figure the store does not count
// is null.
type statsJSON struct {
	Store          string     `json:"store"`
	Now            jsonTime   `json:"now"`
	InProgress     idem.Count `json:"in_progress"`
	Completed      idem.Count `json:"completed"`
	Failed         idem.Count `json:"failed"`
	Released       idem.Count `json:"released"`
	Stale          idem.Count `json:"stale"`
	StaleAfter     float64    `json:"stale_after_seconds"`
	OldestLockedAt jsonTime   `json:"oldest_locked_at"`
	OldestAge      *float64   `json:"oldest_age_seconds"`
	Expired        idem.Count `json:"expired"`
}

// Stats writes the store's figures (idem.Store.Stats with o.Lease as the
// stale threshold): records by state, stale claims, the oldest lease and
// its age, and the expired records awaiting a purge. Times and ages are the
// store's clock.
func Stats(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	st, err := o.Store.Stats(ctx, o.Lease)
	if err != nil {
		return err
	}
	if o.JSON {
		j := statsJSON{Store: o.Name, Now: jsonTime(st.Now), InProgress: st.InProgress, Completed: st.Completed,
			Failed: st.Failed, Released: st.Released, Stale: st.Stale, StaleAfter: seconds(o.Lease), OldestLockedAt: jsonTime(st.OldestLockedAt),
			Expired: st.Expired}
		if !st.OldestLockedAt.IsZero() {
			a := seconds(st.Now.Sub(st.OldestLockedAt))
			j.OldestAge = &a
		}
		return writeJSON(w, j)
	}
	return fields(w, [][2]string{
		{"store", o.Name},
		{"store clock", utc(st.Now)},
		{"in progress", st.InProgress.String()},
		{"  stale", st.Stale.String() + " (locked " + o.Lease.String() + " or more ago)"},
		{"  oldest lock", stamp(st.OldestLockedAt, st.Now)},
		{"completed", st.Completed.String()},
		{"failed", st.Failed.String()},
		{"released", st.Released.String() + " (free again; kept for their nonce)"},
		{"expired", st.Expired.String() + " (awaiting purge)"},
	})
}

// Stale writes the in-progress records whose lease is older than o.Lease
// (idem.Store.ListStale), oldest first, at most o.Limit.
func Stale(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	recs, err := o.Store.ListStale(ctx, o.Lease, o.Limit)
	if err != nil {
		return err
	}
	now := o.Now()
	if o.JSON {
		out := make([]recordJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toJSON(r, now, false))
		}
		return writeJSON(w, out)
	}
	if len(recs) == 0 {
		_, err := fmt.Fprintf(w, "no stale claims (none in progress for %v or more)\n", o.Lease)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tREQUEST ID\tLOCKED AT (UTC)\tAGE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Principal, r.Key, r.RequestID, utc(r.LockedAt), roundAge(now.Sub(r.LockedAt)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if len(recs) == o.Limit {
		more = " (the limit; there may be more: --limit)"
	}
	_, err = fmt.Fprintf(w, "%d stale claims, lease %v%s\n", len(recs), o.Lease, more)
	return err
}

// get reads the record for (principal, key); a missing one is an error
// wrapping idem.ErrNotFound that names them.
func get(ctx context.Context, o Options, principal, key string) (idem.Record, error) {
	r, err := o.Store.Get(ctx, principal, key)
	if errors.Is(err, idem.ErrNotFound) {
		return r, fmt.Errorf("no record for principal %q key %q: %w", principal, key, idem.ErrNotFound)
	}
	return r, err
}

// Show writes the record for (principal, key): state, fingerprint, request
// id, lease token, times, and the stored status and headers; the body only
// with o.Body. It returns an error wrapping idem.ErrNotFound when there is
// no record.
func Show(ctx context.Context, w io.Writer, o Options, principal, key string) error {
	o.defaults()
	r, err := get(ctx, o, principal, key)
	if err != nil {
		return err
	}
	now := o.Now()
	if o.JSON {
		return writeJSON(w, toJSON(r, now, o.Body))
	}
	state := string(r.State)
	if !now.Before(r.ExpiresAt) {
		state += " (expired: counts as absent, awaiting purge)"
	} else if r.State == idem.StateInProgress {
		if now.Sub(r.LockedAt) >= o.Lease {
			state += " (stale: lease of " + o.Lease.String() + " expired)"
		} else {
			state += " (lease live)"
		}
	}
	rows := [][2]string{
		{"principal", r.Principal},
		{"key", r.Key},
		{"state", state},
		{"fingerprint", fmt.Sprintf("%x", r.Fingerprint)},
		{"request id", r.RequestID},
		{"lease token", r.LeaseToken},
		{"created at", stamp(r.CreatedAt, now)},
		{"locked at", stamp(r.LockedAt, now)},
		{"expires at", stamp(r.ExpiresAt, now)},
	}
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

// ForceRisk is what --force risks, which Release says when it refuses a
// live lease and when it is forced to release one.
const ForceRisk = "its holder may still be running: a retry can then run the handler again while the holder runs, " +
	"so effects outside the store (a provider call, an email) may happen twice; the holder's settle then " +
	"misses its fence (on a SQL store its own writes roll back)"

// Release deletes the in-progress record for (principal, key), fenced by
// the lease token it read: if the holder settles, or a retry takes the key
// over, after the read, the release deletes nothing and returns an error
// wrapping ErrRefused. It refuses a settled record, and a live lease
// (locked less than o.Lease ago by this machine's clock) unless o.Force.
// It asks for confirmation (o.Confirm) unless o.Yes; o.DryRun says what it
// would do and does nothing.
func Release(ctx context.Context, w io.Writer, o Options, principal, key string) error {
	o.defaults()
	r, err := get(ctx, o, principal, key)
	if err != nil {
		return err
	}
	if r.State == idem.StateReleased {
		return fmt.Errorf("%w: %s/%s is released already: its key is free", ErrRefused, principal, key)
	}
	if r.State != idem.StateInProgress {
		return fmt.Errorf("%w: %s/%s is %s: only an in-progress claim is released (a stored outcome is replayed until it expires)",
			ErrRefused, principal, key, r.State)
	}
	lockAge := o.Now().Sub(r.LockedAt)
	live := lockAge < o.Lease
	if live && !o.Force {
		return fmt.Errorf("%w: %s/%s holds a live lease (locked %v ago, lease %v); %s. Pass --force to release it anyway",
			ErrRefused, principal, key, roundAge(lockAge), o.Lease, ForceRisk)
	}
	what := fmt.Sprintf("%s/%s (in progress, locked %v ago, request id %s, lease token %s)",
		principal, key, roundAge(lockAge), r.RequestID, r.LeaseToken)
	result := map[string]any{"principal": principal, "key": key, "request_id": r.RequestID,
		"lease_token": r.LeaseToken, "locked_at": jsonTime(r.LockedAt), "live_lease": live}
	if o.DryRun {
		result["released"], result["dry_run"] = false, true
		if o.JSON {
			return writeJSON(w, result)
		}
		_, err := fmt.Fprintf(w, "would release %s\n", what)
		return err
	}
	question := "release " + what + "?"
	if live {
		question = "FORCE: the lease is live; " + ForceRisk + ". Release " + what + "?"
	}
	if err := o.confirm(question); err != nil {
		return err
	}
	err = o.Store.Release(ctx, idem.Lease{Principal: principal, Key: key, Token: r.LeaseToken})
	if errors.Is(err, idem.ErrLeaseLost) {
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
	_, err = fmt.Fprintf(w, "released %s\n", what)
	return err
}

// purgeBatch and purgeMaxBatches bound one Purge: at most 100 000 records.
const (
	purgeBatch      = 500
	purgeMaxBatches = 200
)

// Purge deletes the expired records (idem.Store.PurgeExpired in batches of
// 500, until a batch deletes nothing). It counts them first (Stats) and
// asks for confirmation unless o.Yes; o.DryRun only counts.
func Purge(ctx context.Context, w io.Writer, o Options) error {
	o.defaults()
	st, err := o.Store.Stats(ctx, o.Lease)
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
