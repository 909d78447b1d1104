package bench

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// sqlFloor is the floor (Floor's logic, by hand on database/sql) on
// MariaDB or SQLite. Its claim is an INSERT that does nothing when the key
// exists (MariaDB: ON DUPLICATE KEY UPDATE of the key to itself, SQLite: ON
// CONFLICT DO NOTHING), told apart by rows affected: neither can return
// the existing row from it. On SQLite, whose writers the database
// serialises by polling for its lock, writeMu queues this process's
// writers instead (as idemgorm's write gate does).
type sqlFloor struct {
	db                                       *sql.DB
	claimSQL, readSQL, settleSQL, releaseSQL string
	insertSQL                                string
	writeMu                                  *sync.Mutex
}

// newSQLFloor builds the floor's statements for keys and payments; upsert
// is the dialect's "do nothing on a duplicate key" clause.
func newSQLFloor(db *sql.DB, keys, payments, upsert string, writeMu *sync.Mutex) *sqlFloor {
	const where = ` WHERE principal = ? AND idem_key = ?`
	return &sqlFloor{
		db: db,
		claimSQL: `INSERT INTO ` + keys + ` (principal, idem_key, fingerprint, state, lease_token, expires_at)
VALUES (?, ?, ?, 'in_progress', ?, ?) ` + upsert,
		readSQL:    `SELECT state, fingerprint, status, location, body FROM ` + keys + where,
		settleSQL:  `UPDATE ` + keys + ` SET state = ?, status = ?, location = ?, body = ?` + where + ` AND lease_token = ? AND state = 'in_progress'`,
		releaseSQL: `DELETE FROM ` + keys + where + ` AND lease_token = ? AND state = 'in_progress'`,
		insertSQL:  `INSERT INTO ` + payments + ` (id, account, amount, currency, description) VALUES (?, ?, ?, ?, ?)`,
		writeMu:    writeMu,
	}
}

func (f *sqlFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) { serveFloor(w, r, f) }

func (f *sqlFloor) lock() func() {
	if f.writeMu == nil {
		return func() {}
	}
	f.writeMu.Lock()
	return f.writeMu.Unlock
}

func (f *sqlFloor) claim(ctx context.Context, c floorClaimArgs) (bool, floorRow, error) {
	unlock := f.lock()
	res, err := f.db.ExecContext(ctx, f.claimSQL, c.account, c.key, c.fp, c.token, time.Now().Add(24*time.Hour).UnixMicro())
	unlock()
	if err != nil {
		return false, floorRow{}, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err == nil, floorRow{}, err
	}
	var (
		row    = floorRow{found: true}
		status sql.NullInt64
		loc    sql.NullString
	)
	err = f.db.QueryRowContext(ctx, f.readSQL, c.account, c.key).Scan(&row.state, &row.fp, &status, &loc, &row.body)
	if errors.Is(err, sql.ErrNoRows) {
		return false, floorRow{}, nil
	}
	row.settled, row.status, row.loc = status.Valid, int(status.Int64), loc.String
	return false, row, err
}

func (f *sqlFloor) begin(ctx context.Context, c floorClaimArgs) (floorTx, error) {
	unlock := f.lock()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		unlock()
		return nil, err
	}
	return &sqlFloorTx{f: f, tx: tx, c: c, unlock: unlock}, nil
}

func (f *sqlFloor) release(ctx context.Context, c floorClaimArgs) {
	defer f.lock()()
	_, _ = f.db.ExecContext(ctx, f.releaseSQL, c.account, c.key, c.token)
}

type sqlFloorTx struct {
	f      *sqlFloor
	tx     *sql.Tx
	c      floorClaimArgs
	unlock func()
}

func (t *sqlFloorTx) insert(ctx context.Context, id, account string, p PaymentRequest) error {
	_, err := t.tx.ExecContext(ctx, t.f.insertSQL, id, account, p.Amount, p.Currency, p.Description)
	return err
}

func (t *sqlFloorTx) settle(ctx context.Context, s floorOutcome) (bool, error) {
	res, err := t.tx.ExecContext(ctx, t.f.settleSQL, s.state, s.status, s.loc, s.body, t.c.account, t.c.key, t.c.token)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (t *sqlFloorTx) commit(context.Context) error {
	defer t.unlock()
	return t.tx.Commit()
}

func (t *sqlFloorTx) rollback(context.Context) {
	defer t.unlock()
	_ = t.tx.Rollback()
}

// redisFloor is the floor for Redis, where nothing commits the record and
// the payment together: the claim is SET NX GET (Redis 7), which claims the
// key or returns its value in one round trip; the payment is an
// INSERT … ON CONFLICT (downstream_key) DO NOTHING in PostgreSQL, in
// autocommit, the unique column keeping a re-run from paying twice; the
// settle and the release are Lua scripts fenced by the lease token. The
// value is the state's first letter, the fingerprint (32 bytes), the token
// (32 hex digits), then once settled the status (3 digits), the location,
// a newline and the body. What it leaves out besides Floor's omissions:
// checking the lease before the payment, and answering a re-run from the
// row it finds.
type redisFloor struct {
	rdb      *redis.Client
	pg       *pgxpool.Pool
	prefix   string
	payments string
}

const redisFloorTTL = 24 * time.Hour

// redisFloorFenced runs its body only when KEYS[1] holds ARGV[1]'s claim.
const redisFloorFenced = `local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'i' or string.sub(v, 34, 65) ~= ARGV[1] then return 0 end
`

var (
	redisFloorSettle  = redis.NewScript(redisFloorFenced + `redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') return 1`)
	redisFloorRelease = redis.NewScript(redisFloorFenced + `redis.call('DEL', KEYS[1]) return 1`)
)

func (f *redisFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) { serveFloor(w, r, f) }

// scoped is the key scoped by its principal, unambiguously.
func (c floorClaimArgs) scoped() string {
	return strconv.Itoa(len(c.account)) + ":" + c.account + ":" + c.key
}

func (f *redisFloor) rkey(c floorClaimArgs) string { return f.prefix + c.scoped() }

// redisFloorValue is the claim's value; settled appends the response.
func redisFloorValue(state string, c floorClaimArgs) string {
	return state[:1] + string(c.fp) + c.token
}

func (f *redisFloor) claim(ctx context.Context, c floorClaimArgs) (bool, floorRow, error) {
	v, err := f.rdb.SetArgs(ctx, f.rkey(c), redisFloorValue("in_progress", c), redis.SetArgs{Mode: "NX", Get: true, TTL: redisFloorTTL}).Result()
	if errors.Is(err, redis.Nil) {
		return true, floorRow{}, nil
	}
	if err != nil {
		return false, floorRow{}, err
	}
	if len(v) < 65 {
		return false, floorRow{}, errors.New("redis floor: short value")
	}
	row := floorRow{found: true, fp: []byte(v[1:33])}
	switch v[0] {
	case 'i':
		row.state = "in_progress"
	default:
		row.state, row.settled = "settled", true
		row.status, _ = strconv.Atoi(v[65:68])
		loc, body, _ := strings.Cut(v[68:], "\n")
		row.loc, row.body = loc, []byte(body)
	}
	return false, row, nil
}

func (f *redisFloor) begin(_ context.Context, c floorClaimArgs) (floorTx, error) {
	return redisFloorTx{f, c}, nil
}

func (f *redisFloor) release(ctx context.Context, c floorClaimArgs) {
	_ = redisFloorRelease.Run(ctx, f.rdb, []string{f.rkey(c)}, c.token).Err()
}

type redisFloorTx struct {
	f *redisFloor
	c floorClaimArgs
}

func (t redisFloorTx) insert(ctx context.Context, id, account string, p PaymentRequest) error {
	return insertKeyedPayment(ctx, t.f.pg, t.f.payments, t.c.scoped(), id, account, p)
}

func (t redisFloorTx) settle(ctx context.Context, s floorOutcome) (bool, error) {
	v := redisFloorValue(s.state, t.c) + strconv.Itoa(s.status) + s.loc + "\n" + string(s.body)
	n, err := redisFloorSettle.Run(ctx, t.f.rdb, []string{t.f.rkey(t.c)}, t.c.token, v).Int()
	return n == 1, err
}

func (redisFloorTx) commit(context.Context) error { return nil }
func (redisFloorTx) rollback(context.Context)     {}

// insertKeyedPayment writes a payment in PostgreSQL under a downstream key,
// or nothing when that key has one: the Redis variants' business write.
func insertKeyedPayment(ctx context.Context, pg *pgxpool.Pool, table, downstreamKey, id, account string, p PaymentRequest) error {
	_, err := pg.Exec(ctx, `INSERT INTO `+table+` (id, downstream_key, account, amount, currency, description)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (downstream_key) DO NOTHING`,
		id, downstreamKey, account, p.Amount, p.Currency, p.Description)
	return err
}
