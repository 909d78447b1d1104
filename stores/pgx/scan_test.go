package idempgx_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"

	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/idemgo/idem/stores/pgx/idempgxtest"
)

// TestScanRecordAgreesWithPgx: the store decodes its rows' binary values
// itself; every record it reads must be the one pgx's own Scan makes of the
// same row, and a row pgx refuses (an infinite time, a NULL where the
// record has no room for one) must be refused too. In the text exec modes,
// and on a connection with a timestamptz codec of its own, both take pgx's
// path.
func TestScanRecordAgreesWithPgx(t *testing.T) {
	cases := []struct {
		name     string
		mode     pgx.QueryExecMode
		utcTimes bool // the connection's type map scans timestamptz in UTC
	}{
		{"cache_statement", pgx.QueryExecModeCacheStatement, false},
		{"exec", pgx.QueryExecModeExec, false},
		{"own_timestamptz_codec", pgx.QueryExecModeCacheStatement, true},
	}
	for _, c := range cases {
		mode := c.mode
		t.Run(c.name, func(t *testing.T) {
			cfg := idempgxtest.PoolConfig(t, 1) // one connection, whose buffers every query reuses
			if c.utcTimes {
				cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
					conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
						Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
					return nil
				}
			}
			e := newEnv(t, idempgxtest.OpenPool(t, cfg))
			ctx := testCtx(t)
			T := e.Store.Table()
			rows := []string{
				// in progress, no response
				`('alice', 'k1', '\x0102', 'in_progress', 't1', 'r1', 'n1', now(), now(), now() + interval '1 minute', now() + interval '1 day', false, NULL, NULL, NULL)`,
				// settled, headers and body, uncertain cleared
				`('alice', 'k2', '\x01', 'completed', 't2', '', 'n2', now() - interval '1 hour', now(), now(), now() + interval '1 day', false, 201, '\x` + headerHex(t) + `', '{"id":1}')`,
				// settled with an empty body and empty headers; a fingerprint of zero bytes
				`('alice', 'k3', '', 'failed', 't3', 'r3', 'n3', '2000-01-01 00:00:00.000001+00', '1999-12-31 23:59:59.999999+00', '1970-01-01 00:00:00+00', '9999-12-31 23:59:59.999999+00', true, 500, '', '')`,
				// a state the store does not write, times at the ends of the range
				`('alice', 'k4', '\xff', 'other', 't4', 'r4', 'n4', '4713-11-24 00:00:00+00 BC', '294276-12-31 23:59:59.999999+00', now(), now(), false, 200, NULL, NULL)`,
				// infinite times, which pgx refuses for a time.Time
				`('alice', 'k5', '\x01', 'completed', 't5', 'r5', 'n5', now(), now(), now(), 'infinity', false, 200, '', '')`,
				`('alice', 'k6', '\x01', 'completed', 't6', 'r6', 'n6', '-infinity', now(), now(), now(), false, 200, '', '')`,
				// a status with headers that do not decode
				`('alice', 'k7', '\x01', 'completed', 't7', 'r7', 'n7', now(), now(), now(), now(), false, 200, '\x07', '')`,
			}
			for _, r := range rows {
				if _, err := e.Pool.Exec(ctx, `INSERT INTO `+T+` (principal, key, fingerprint, state, lease_token, request_id, nonce,
					created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body) VALUES `+r); err != nil {
					t.Fatalf("insert %s: %v", r, err)
				}
			}
			sel := `SELECT principal, key, fingerprint, state, lease_token, request_id, nonce,
				created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body`
			// A NULL where the record has none: no row of the table has one.
			selNull := `SELECT principal, NULL::text, fingerprint, state, lease_token, request_id, nonce,
				created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body`
			good := 0
			for _, withNow := range []bool{false, true} {
				now := ""
				if withNow {
					now = ", now()"
				}
				for i := range rows {
					key := "k" + strconv.Itoa(i+1)
					good += compareScans(ctx, t, e.Pool, mode, sel+now+` FROM `+T+` WHERE key = $1`, key, withNow)
				}
				compareScans(ctx, t, e.Pool, mode, selNull+now+` FROM `+T+` WHERE key = $1`, "k1", withNow)
			}
			if good != 8 {
				t.Errorf("%d rows scanned without error, want 8", good)
			}
		})
	}
}

// compareScans scans the one row sql returns for key both ways and
// reports whether it scanned without error.
func compareScans(ctx context.Context, t *testing.T, pool *pgxpool.Pool, mode pgx.QueryExecMode, sql, key string, withNow bool) int {
	t.Helper()
	var (
		recs [2]idem.Record
		nows [2]time.Time
		errs [2]error
	)
	for i, generic := range []bool{false, true} {
		rows, err := pool.Query(ctx, sql, mode, key)
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatalf("%s: no row: %v", key, rows.Err())
		}
		recs[i], nows[i], errs[i] = idempgx.ScanRecord(rows, withNow, generic)
		rows.Close()
	}
	// What was scanned owns its bytes: another query on the connection
	// changes nothing in it.
	kept := fmt.Sprintf("%#v", recs)
	var filler string
	if err := pool.QueryRow(ctx, `SELECT repeat('x', 4096), '\xffffffffffffffffffff'::bytea`).Scan(&filler, new([]byte)); err != nil {
		t.Fatal(err)
	}
	if now := fmt.Sprintf("%#v", recs); now != kept {
		t.Errorf("%s: the scanned record changed with the connection's next query:\n%s\n%s", key, kept, now)
	}
	if (errs[0] == nil) != (errs[1] == nil) {
		t.Errorf("%s: scanned with error %v, pgx's %v", key, errs[0], errs[1])
		return 0
	}
	if errs[0] != nil {
		return 0
	}
	if !reflect.DeepEqual(recs[0], recs[1]) {
		t.Errorf("%s: scanned\n%#v\npgx's\n%#v", key, recs[0], recs[1])
	}
	if withNow && (nows[0].IsZero() || nows[0].Sub(nows[1]).Abs() > time.Minute) {
		t.Errorf("%s: now() scanned %v, pgx's %v", key, nows[0], nows[1])
	}
	return 1
}

func headerHex(t *testing.T) string {
	t.Helper()
	return hex.EncodeToString(idemstore.EncodeHeader(http.Header{"Content-Type": {"application/json"}, "Location": {"/p/1"}}))
}
