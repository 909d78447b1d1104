package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// dbState is what the database (and the provider) hold at the end, per
// account: every key has an account of its own, so the account names the
// key.
type dbState struct {
	payments map[string][]string // account -> payment ids
	records  map[string]string   // account -> record state ("completed", "in_progress", "uncertain", ...)
	charges  map[string]int      // account -> provider charges; nil without a provider
}

// report is the verdict on a run's history.
type report struct {
	keys, got201, fresh201 int
	// Failures: any of these is a broken promise.
	duplicates int // a key with more than one payment
	divergent  int // a key whose final answers differ (two 201 bodies, or a 201 then another answer)
	lost       int // a key answered 201 with no payment behind it
	mismatched int // a 201 whose payment id is not the one payment's
	charged    int // a key the provider charged more than once
	strays     int // payments of accounts no client used
	// Not failures, counted and explained.
	orphans           int // payments of keys that got no 201
	orphansReplayable int // of which the record is completed: a retry would be answered the payment's 201
	unresolved        int // keys without a final answer
	unknown           int // of which answered 409 outcome-unknown
	// longest is the longest time a key took to its first final answer.
	longest  time.Duration
	slowest  *keyHistory // the key that took it
	examples []string
}

func (r *report) failed() bool {
	return r.duplicates+r.divergent+r.lost+r.mismatched+r.charged+r.strays > 0
}

func (r *report) fail(format string, args ...any) {
	if len(r.examples) < 8 {
		r.examples = append(r.examples, fmt.Sprintf(format, args...))
	}
}

// check judges the history against the end state, key by key.
func check(hs []*keyHistory, db dbState) report {
	var r report
	seen := map[string]bool{}
	for _, h := range hs {
		r.keys++
		seen[h.account] = true
		pays := db.payments[h.account]
		r.fresh201 += h.fresh
		if h.took > r.longest {
			r.longest, r.slowest = h.took, h
		}
		if len(pays) > 1 {
			r.duplicates++
			r.fail("key %s (%s): %d payments %v", h.key, h.account, len(pays), pays)
		}
		if db.charges != nil && db.charges[h.account] > 1 {
			r.charged++
			r.fail("key %s (%s): charged %d times", h.key, h.account, db.charges[h.account])
		}
		for _, a := range h.answers[min(1, len(h.answers)):] {
			if a != h.answers[0] {
				r.divergent++
				r.fail("key %s (%s): answered %d %q, then %d %q", h.key, h.account, h.answers[0].status, h.answers[0].body, a.status, a.body)
				break
			}
		}
		if len(h.answers) == 0 {
			r.unresolved++
			if h.unknown {
				r.unknown++
			}
		}
		if !h.got201() {
			if len(pays) > 0 {
				r.orphans++
				if db.records[h.account] == "completed" {
					r.orphansReplayable++
				}
			}
			continue
		}
		r.got201++
		if len(pays) == 0 {
			r.lost++
			r.fail("key %s (%s): answered 201 and has no payment", h.key, h.account)
			continue
		}
		for _, a := range h.answers {
			if a.status != http.StatusCreated {
				continue
			}
			var p struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.ID != pays[0] {
				r.mismatched++
				r.fail("key %s (%s): 201 body %q, payment %s", h.key, h.account, a.body, pays[0])
				break
			}
		}
	}
	for acct := range db.payments {
		if !seen[acct] {
			r.strays++
			r.fail("payments %v of account %s, which no client used", db.payments[acct], acct)
		}
	}
	sort.Strings(r.examples)
	return r
}

// summary is the run's one line.
func (r *report) summary(store string, faults []string, requests int64) string {
	verdict := "PASS"
	if r.failed() {
		verdict = "FAIL"
	}
	return fmt.Sprintf("nemesis %s store=%s keys=%d 201=%d fresh201=%d duplicates=%d divergent=%d lost=%d mismatched=%d "+
		"charged-twice=%d strays=%d orphans=%d (replayable %d) unresolved=%d (outcome-unknown %d) longest=%v requests=%d faults=%s",
		verdict, store, r.keys, r.got201, r.fresh201, r.duplicates, r.divergent, r.lost, r.mismatched,
		r.charged, r.strays, r.orphans, r.orphansReplayable, r.unresolved, r.unknown, r.longest.Round(10*time.Millisecond), requests, strings.Join(faults, ","))
}
