package ctl

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// timeLayout is how the text output writes times: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

// utc writes t in UTC, or "-" for the zero time.
func utc(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

// age writes how long before now t was ("3m12s ago"), or after ("in 23h59m").
func age(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + roundAge(-d).String()
	}
	return roundAge(d).String() + " ago"
}

// roundAge keeps ages readable: whole seconds from ten seconds on.
func roundAge(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(10 * time.Millisecond)
}

// stamp is a time and its age, for text output.
func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return utc(t) + " (" + age(t, now) + ")"
}

// jsonTime is a time for JSON: RFC 3339 in UTC, null when zero.
type jsonTime time.Time

func (t jsonTime) MarshalJSON() ([]byte, error) {
	if time.Time(t).IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(time.Time(t).UTC().Format(time.RFC3339Nano))
}

// seconds is an age in seconds for JSON, rounded to the millisecond.
func seconds(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fields writes name/value lines aligned in two columns.
func fields(w io.Writer, rows [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// recordJSON is a record as the JSON output shows it.
type recordJSON struct {
	Principal   string              `json:"principal"`
	Key         string              `json:"key"`
	State       idemstore.State     `json:"state"`
	Fingerprint string              `json:"fingerprint"`
	RequestID   string              `json:"request_id"`
	LeaseToken  string              `json:"lease_token"`
	CreatedAt   jsonTime            `json:"created_at"`
	LockedAt    jsonTime            `json:"locked_at"`
	LeaseEnds   jsonTime            `json:"lease_expires_at"`
	ExpiresAt   jsonTime            `json:"expires_at"`
	LockAge     float64             `json:"lock_age_seconds"`
	Stale       bool                `json:"stale"`     // in progress, past its LeaseExpiresAt
	Uncertain   bool                `json:"uncertain"` // outcome unknown (idem.Record.Uncertain)
	Expired     bool                `json:"expired"`
	Status      *int                `json:"status,omitempty"`
	Headers     map[string][]string `json:"headers,omitempty"`
	BodyBytes   *int                `json:"body_bytes,omitempty"`
	Body        *string             `json:"body,omitempty"`
	BodyBase64  []byte              `json:"body_base64,omitempty"`
}

// toJSON is r as the JSON output shows it, its ages and staleness on now,
// the store's clock.
func toJSON(r idem.Record, now time.Time, withBody bool) recordJSON {
	j := recordJSON{
		Principal: r.Principal, Key: r.Key, State: r.State, Fingerprint: hex.EncodeToString(r.Fingerprint),
		RequestID: r.RequestID, LeaseToken: r.LeaseToken,
		CreatedAt: jsonTime(r.CreatedAt), LockedAt: jsonTime(r.LockedAt), LeaseEnds: jsonTime(r.LeaseExpiresAt),
		ExpiresAt: jsonTime(r.ExpiresAt), LockAge: seconds(now.Sub(r.LockedAt)),
		Stale:     r.State == idemstore.StateInProgress && !now.Before(r.LeaseExpiresAt),
		Uncertain: r.Uncertain, Expired: !now.Before(r.ExpiresAt),
	}
	if resp := r.Response; resp != nil {
		status, n := resp.Status, len(resp.Body)
		j.Status, j.Headers, j.BodyBytes = &status, resp.Header, &n
		if withBody {
			if utf8.Valid(resp.Body) {
				s := string(resp.Body)
				j.Body = &s
			} else {
				j.BodyBase64 = resp.Body
			}
		}
	}
	return j
}
