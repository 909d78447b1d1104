// Package bench holds the benchmarks that compare idem with what users
// would write or pick instead: round trips per request, throughput against
// a real PostgreSQL, and Fiber's own idempotency middleware. It is its own
// module, so none of its dependencies reach the library's modules.
//
// The servers here are shared by the round-trip tests and the load
// generator (cmd/loadgen): the same payment handler (one INSERT) behind
// idemhttp with idempgx, behind idemhttp with idemgorm, and inside a
// hand-written minimal version that calls the claim and settle SQL itself
// (the floor).
package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	idemhttp "github.com/idemgo/idem/adapters/nethttp"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idempgx "github.com/idemgo/idem/stores/pgx"
)

// DefaultDSN is the PostgreSQL the benchmarks use unless IDEM_PG_DSN says
// otherwise. Only 127.0.0.1.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns IDEM_PG_DSN or DefaultDSN.
func DSN() string {
	if v := os.Getenv("IDEM_PG_DSN"); v != "" {
		return v
	}
	return DefaultDSN
}

// Schema is the PostgreSQL schema every benchmark table lives in.
const Schema = "idem_bench"

// Table names, all in Schema.
const (
	PgxKeys      = Schema + ".pgx_keys"
	GormKeys     = Schema + ".gorm_keys"
	FloorKeys    = Schema + ".floor_keys"
	PgxPayments  = Schema + ".payments_pgx"
	GormPayments = Schema + ".payments_gorm"
	FloorPayment = Schema + ".payments_floor"
)

// Setup creates the schema afresh (dropping what an earlier run, perhaps of
// an older schema, left), the payment tables, the floor's key table and
// both stores' tables (through their own Migrate).
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	stmts := []string{
		"DROP SCHEMA IF EXISTS " + Schema + " CASCADE",
		"CREATE SCHEMA " + Schema,
		`CREATE TABLE IF NOT EXISTS ` + FloorKeys + ` (
			principal   text        NOT NULL,
			key         text        NOT NULL,
			fingerprint bytea       NOT NULL,
			state       text        NOT NULL,
			lease_token text        NOT NULL,
			expires_at  timestamptz NOT NULL,
			status      integer,
			location    text,
			body        bytea,
			PRIMARY KEY (principal, key))`,
	}
	for _, t := range []string{PgxPayments, GormPayments, FloorPayment} {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+t+` (
			id          text        PRIMARY KEY,
			account     text        NOT NULL,
			amount      bigint      NOT NULL,
			currency    text        NOT NULL,
			description text        NOT NULL,
			created_at  timestamptz NOT NULL DEFAULT now())`)
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return nil
}

// Truncate empties every benchmark table that exists, so each cell starts
// alike. A store's key table exists only once a server for it was built
// (its Migrate creates it), so a run of some variants skips the others'.
func Truncate(ctx context.Context, pool *pgxpool.Pool) error {
	var tables []string
	for _, t := range []string{PgxKeys, GormKeys, FloorKeys, PgxPayments, GormPayments, FloorPayment} {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t).Scan(&exists); err != nil {
			return fmt.Errorf("truncate: %w", err)
		}
		if exists {
			tables = append(tables, t)
		}
	}
	_, err := pool.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", "))
	return err
}

// Principal reads "Authorization: Bearer <account>", the stand-in for the
// auth middleware every variant sits behind.
func Principal(r *http.Request) (string, error) {
	p, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || p == "" || len(p) > 64 {
		return "", nil
	}
	return p, nil
}

// PaymentRequest is the body clients post.
type PaymentRequest struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
}

// Payment is the handler's answer.
type Payment struct {
	ID          string `json:"id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
	Status      string `json:"status"`
}

// Insert writes one payment row through whatever transaction the variant
// uses.
type Insert func(ctx context.Context, id, account string, p PaymentRequest) error

// Hold, when non-nil, is waited on by the payment handler after its
// insert when the request carries X-Bench-Hold (at most 10 s). The
// round-trip test uses it to keep a key in progress for the 409 case.
var Hold chan struct{}

// Pay is the payment handler every variant runs: decode, validate, insert
// one row, answer 201 with the payment and its Location. It returns the
// status, the Location and the body, so the floor can store them.
func Pay(ctx context.Context, r *http.Request, body []byte, account string, insert Insert) (int, string, []byte) {
	var p PaymentRequest
	if err := json.Unmarshal(body, &p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
		return http.StatusBadRequest, "", []byte(`{"error":"invalid payment"}`)
	}
	id := "pay_" + randHex(8)
	if err := insert(ctx, id, account, p); err != nil {
		return http.StatusServiceUnavailable, "", []byte(`{"error":"unavailable"}`)
	}
	if Hold != nil && r.Header.Get("X-Bench-Hold") != "" {
		select {
		case <-Hold:
		case <-time.After(10 * time.Second):
		}
	}
	out, _ := json.Marshal(Payment{ID: id, Amount: p.Amount, Currency: p.Currency, Description: p.Description, Status: "succeeded"})
	return http.StatusCreated, "/payments/" + id, out
}

// payHandler adapts Pay to a plain handler behind the middleware.
func payHandler(insert Insert) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		account, _ := Principal(r)
		status, loc, out := Pay(r.Context(), r, body, account, insert)
		h := w.Header()
		h.Set("Content-Type", "application/json")
		if loc != "" {
			h.Set("Location", loc)
		}
		w.WriteHeader(status)
		_, _ = w.Write(out)
	})
}

// NewPgxServer is idemhttp + idempgx in front of the payment handler.
func NewPgxServer(ctx context.Context, pool *pgxpool.Pool) (http.Handler, error) {
	store, err := idempgx.New(pool, idempgx.WithTable(PgxKeys))
	if err != nil {
		return nil, err
	}
	return newServer(ctx, store, func(ctx context.Context, id, account string, p PaymentRequest) error {
		tx, ok := idempgx.Tx(ctx)
		if !ok {
			return errors.New("no idempotency transaction")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+PgxPayments+` (id, account, amount, currency, description)
			VALUES ($1, $2, $3, $4, $5)`, id, account, p.Amount, p.Currency, p.Description)
		return err
	})
}

// NewGormServer is idemhttp + idemgorm (PostgreSQL) in front of the payment
// handler.
func NewGormServer(ctx context.Context, db *gorm.DB) (http.Handler, error) {
	return newGormServer(ctx, db, GormKeys, GormPayments)
}

// newGormServer is idemhttp + idemgorm on any of its databases, with its
// records in keys and the payments in payments.
func newGormServer(ctx context.Context, db *gorm.DB, keys, payments string) (http.Handler, error) {
	store, err := idemgorm.New(db, idemgorm.WithTable(keys))
	if err != nil {
		return nil, err
	}
	return newServer(ctx, store, func(ctx context.Context, id, account string, p PaymentRequest) error {
		tx, ok := idemgorm.Tx(ctx)
		if !ok {
			return errors.New("no idempotency transaction")
		}
		return tx.Exec(`INSERT INTO `+payments+` (id, account, amount, currency, description)
			VALUES (?, ?, ?, ?, ?)`, id, account, p.Amount, p.Currency, p.Description).Error
	})
}

// migratingStore is a Store that creates its own table.
type migratingStore interface {
	idemstore.Store
	Migrate(ctx context.Context) error
}

// FingerprintKey is the benchmark servers' idem.Config.FingerprintKey. It
// is public, so no secret: a service reads its own from a secret store.
var FingerprintKey = []byte("idem bench fingerprint key, not a secret")

// newServer migrates store, builds an engine on it and puts idemhttp on
// that engine in front of the payment handler, which writes through insert.
func newServer(ctx context.Context, store migratingStore, insert Insert) (http.Handler, error) {
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	eng, err := idem.New(idem.Config{Store: store, FingerprintKey: FingerprintKey})
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(idemhttp.Config{Engine: eng, Principal: Principal})
	if err != nil {
		return nil, err
	}
	return mw(payHandler(insert)), nil
}

// Floor is the hand-written minimal correct version on PostgreSQL: the
// claim is INSERT … ON CONFLICT DO NOTHING RETURNING on the pool; the winner
// runs the payment insert, a settle UPDATE fenced by its lease token and
// COMMIT in one transaction; a loser reads the row and replays it (or
// answers 409 or 422). A failed handler rolls back and deletes its claim.
// What it leaves out compared with idem: expiry and stale-lease takeover (a
// crashed holder blocks its key until someone deletes the row), canonical
// JSON, a request deadline, stored-header allow-list, problem details,
// observability, the snapshot race's retry (a claim that loses to a row
// released meanwhile answers 409). The floors on the other databases
// (floors.go) share its request path (serveFloor) and differ only in their
// statements.
type Floor struct {
	Pool *pgxpool.Pool
}

const (
	floorClaim = `INSERT INTO ` + FloorKeys + ` (principal, key, fingerprint, state, lease_token, expires_at)
VALUES ($1, $2, $3, 'in_progress', $4, now() + interval '24 hours')
ON CONFLICT (principal, key) DO NOTHING RETURNING lease_token`
	floorRead   = `SELECT state, fingerprint, status, location, body FROM ` + FloorKeys + ` WHERE principal = $1 AND key = $2`
	floorSettle = `UPDATE ` + FloorKeys + ` SET state = $4, status = $5, location = $6, body = $7
WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'`
	floorRelease = `DELETE FROM ` + FloorKeys + ` WHERE principal = $1 AND key = $2 AND lease_token = $3 AND state = 'in_progress'`
)

func (f *Floor) ServeHTTP(w http.ResponseWriter, r *http.Request) { serveFloor(w, r, f) }

func (f *Floor) claim(ctx context.Context, c floorClaimArgs) (bool, floorRow, error) {
	var got string
	err := f.Pool.QueryRow(ctx, floorClaim, c.account, c.key, c.fp, c.token).Scan(&got)
	if !errors.Is(err, pgx.ErrNoRows) {
		return err == nil, floorRow{}, err
	}
	var (
		row    = floorRow{found: true}
		status *int
		loc    *string
	)
	err = f.Pool.QueryRow(ctx, floorRead, c.account, c.key).Scan(&row.state, &row.fp, &status, &loc, &row.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, floorRow{}, nil
	}
	row.setResponse(status, loc)
	return false, row, err
}

func (f *Floor) begin(ctx context.Context, c floorClaimArgs) (floorTx, error) {
	tx, err := f.Pool.Begin(ctx)
	return pgxFloorTx{tx, c}, err
}

func (f *Floor) release(ctx context.Context, c floorClaimArgs) {
	_, _ = f.Pool.Exec(ctx, floorRelease, c.account, c.key, c.token)
}

type pgxFloorTx struct {
	tx pgx.Tx
	c  floorClaimArgs
}

func (t pgxFloorTx) insert(ctx context.Context, id, account string, p PaymentRequest) error {
	_, err := t.tx.Exec(ctx, `INSERT INTO `+FloorPayment+` (id, account, amount, currency, description)
			VALUES ($1, $2, $3, $4, $5)`, id, account, p.Amount, p.Currency, p.Description)
	return err
}

func (t pgxFloorTx) settle(ctx context.Context, s floorOutcome) (bool, error) {
	tag, err := t.tx.Exec(ctx, floorSettle, t.c.account, t.c.key, t.c.token, s.state, s.status, s.loc, s.body)
	return err == nil && tag.RowsAffected() == 1, err
}

func (t pgxFloorTx) commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t pgxFloorTx) rollback(ctx context.Context)     { _ = t.tx.Rollback(ctx) }

// floorStore is what serveFloor needs of a floor's database.
type floorStore interface {
	// claim inserts the key's in-progress row carrying c.token and
	// reports true, or, when the key has a row already, reports false and
	// that row (found false: it was released in between).
	claim(ctx context.Context, c floorClaimArgs) (bool, floorRow, error)
	// begin starts what the payment and the settle share.
	begin(ctx context.Context, c floorClaimArgs) (floorTx, error)
	// release deletes c's claim if it is still in progress.
	release(ctx context.Context, c floorClaimArgs)
}

// floorTx is the claim holder's unit of work: the payment, the settle
// fenced by the lease token, the commit.
type floorTx interface {
	insert(ctx context.Context, id, account string, p PaymentRequest) error
	// settle stores the outcome; false when the fence matched no row.
	settle(ctx context.Context, s floorOutcome) (bool, error)
	commit(ctx context.Context) error
	rollback(ctx context.Context)
}

type floorClaimArgs struct {
	account, key, token string
	fp                  []byte
}

type floorOutcome struct {
	state  string
	status int
	loc    string
	body   []byte
}

// floorRow is a key's stored row as a losing claim reads it.
type floorRow struct {
	found, settled bool
	state          string
	fp             []byte
	status         int
	loc            string
	body           []byte
}

// setResponse fills the row's response from nullable columns.
func (r *floorRow) setResponse(status *int, loc *string) {
	if status != nil {
		r.settled, r.status = true, *status
	}
	if loc != nil {
		r.loc = *loc
	}
}

// serveFloor is every floor's request path: authenticate, fingerprint,
// claim; the winner runs Pay, settles and commits; a loser replays.
func serveFloor(w http.ResponseWriter, r *http.Request, st floorStore) {
	ctx := r.Context()
	account, _ := Principal(r)
	if account == "" {
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 {
		http.Error(w, "idempotency key missing or invalid", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil || len(body) > 1<<20 {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	h := sha256.New()
	for _, s := range []string{r.Method, r.URL.RequestURI(), account} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(body)
	c := floorClaimArgs{account: account, key: key, token: randHex(16), fp: h.Sum(nil)}

	claimed, row, err := st.claim(ctx, c)
	if err != nil {
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	if !claimed {
		replayFloor(w, row, c.fp)
		return
	}
	release := func() { st.release(context.WithoutCancel(ctx), c) }
	tx, err := st.begin(ctx, c)
	if err != nil {
		release()
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	rollback := func() { tx.rollback(context.WithoutCancel(ctx)) }
	status, loc, out := Pay(ctx, r, body, account, tx.insert)
	if status >= 500 {
		rollback()
		release()
		writeJSON(w, status, "", out, false)
		return
	}
	state := "completed"
	if status >= 400 {
		state = "failed"
	}
	ok, err := tx.settle(ctx, floorOutcome{state: state, status: status, loc: loc, body: out})
	if err != nil || !ok {
		rollback()
		if err != nil {
			release()
		}
		http.Error(w, "settle failed", http.StatusConflict)
		return
	}
	if err := tx.commit(ctx); err != nil {
		release()
		http.Error(w, "commit failed", http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, status, loc, out, false)
}

// replayFloor answers a losing claim from the row it found.
func replayFloor(w http.ResponseWriter, row floorRow, fp []byte) {
	switch {
	case !row.found:
		// Released between the claim and the read: the client retries.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "retry", http.StatusConflict)
	case string(row.fp) != string(fp):
		http.Error(w, "key reused with another request", http.StatusUnprocessableEntity)
	case row.state == "in_progress" || !row.settled:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "in progress", http.StatusConflict)
	default:
		writeJSON(w, row.status, row.loc, row.body, true)
	}
}

func writeJSON(w http.ResponseWriter, status int, loc string, body []byte, replayed bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if loc != "" {
		h.Set("Location", loc)
	}
	if replayed {
		h.Set(idem.ReplayedHeader, "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RandHex returns 2n random hex digits.
func RandHex(n int) string { return randHex(n) }
