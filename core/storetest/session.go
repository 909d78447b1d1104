package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// leftStatementTimeout is the statement timeout a left-behind session
// carries: much shorter than the store's, with room for the handler's own
// statements in these cases (the BEGIN batch that carries them, which pgx
// prepares under the session's settings) on a loaded machine.
const leftStatementTimeout = 500 * time.Millisecond

// sessionLeftBehind are the session settings a handler may leave on a
// pooled connection, which no statement of the store may depend on: a
// search_path, first, that puts a schema of look-alikes (hijackSchema, %s)
// before pg_catalog, other time and output formats, and lock and statement
// timeouts much shorter than the store's.
var sessionLeftBehind = map[string][]string{
	"postgres": {
		"SET search_path TO %s, pg_catalog", "SET TIME ZONE 'Pacific/Kiritimati'", "SET DateStyle = 'SQL, DMY'",
		"SET IntervalStyle = 'iso_8601'", "SET bytea_output = 'escape'",
		"SET lock_timeout = '10ms'", fmt.Sprintf("SET statement_timeout = '%dms'", leftStatementTimeout.Milliseconds()),
	},
}

// testSessionLeftBehind runs the claim, replay, fence, stale listing and
// purge cases on a Backend whose every session starts with
// sessionLeftBehind, as on a clean one; with HoldRecord, a Release then
// waits behind a record held twice the session's statement timeout, as
// the store's own timeouts allow, not the session's.
func testSessionLeftBehind(t *testing.T, b Backend) {
	settings := sessionLeftBehind[b.Dialect]
	if b.Session == nil || settings == nil {
		t.Skip("not applicable: the backend cannot start sessions with what a handler leaves behind (Backend.Session)")
	}
	ctx, drop := withHijackSchema(t, b)
	t.Cleanup(drop)
	session := slices.Clone(settings)
	session[0] = fmt.Sprintf(session[0], ctx.Value(hijackKey{}))
	left := func(t testing.TB) Backend {
		lb := b.Session(t, session)
		lb.CountEffects = b.CountEffects // on a clean session: count(*) has a look-alike
		return lb
	}
	all := suite()
	var cases []suiteCase
	for _, c := range all {
		switch c.name {
		case "ClaimNewKey", "ResponseRoundTrip", "StaleHolderSettleIsFenced", "ListStale", "PurgeExpired":
			cases = append(cases, c)
		}
	}
	runCases(t, left, cases)

	t.Run("StoreTimeouts", func(t *testing.T) {
		if b.HoldRecord == nil {
			t.Skip("not applicable: the backend cannot hold a record from outside (Backend.HoldRecord)")
		}
		lb := left(t)
		held := claimReq("alice", uniq("held"), "body")
		mustClaim(t, lb.Store, held)
		release := b.HoldRecord(t, "alice", held.Key)
		const holdFor = 2 * leftStatementTimeout
		released := make(chan struct{})
		time.AfterFunc(holdFor, func() { release(); close(released) })
		start := time.Now()
		err := lb.Store.Release(ctxT(t), leaseOf(held))
		<-released
		if err != nil {
			t.Fatalf("release behind a record held %v: %v", holdFor, err)
		}
		if waited := time.Since(start); waited < holdFor*3/4 {
			t.Fatalf("release returned after %v: the record was not held?", waited)
		}
	})
}
