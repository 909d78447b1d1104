package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	idem "github.com/idemgo/idem/core"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// -store redis: the idempotency records live in Redis (idemredis), the
// payments in the example's SQL database (-payments-db: an SQLite file by
// default, or a PostgreSQL URL). Nothing commits the two together, so the
// payment write is made idempotent by itself: each payment row carries the
// request's downstream key, idem.DownstreamKey(ctx, "payment"), in a
// unique column, and is inserted with ON CONFLICT DO NOTHING. Whatever
// runs the request again — a retry after a takeover, a Redis that lost the
// record, two holders after a failover — writes the same row and answers
// from it, after comparing it with the request (another body under the
// key is 422, as the fingerprint would have answered). There is no
// Config.Reconcile that answers a takeover from the row: it would get the
// stale record, not the request, and so could not compare; the takeover
// runs the handler, whose insert finds the row and compares. A failure the handler sees after
// its write (the failure drills, the request timeout) deletes the row again
// (Undo), since no rollback will.

// redisPaymentStep names the payment write for idem.DownstreamKey.
const redisPaymentStep = "payment"

// redisPayment is a payment row of -store redis: a Payment plus its
// downstream key, unique. Its own table and index names, so that it can
// share a PostgreSQL schema with the other stores' payments table.
type redisPayment struct {
	ID            string    `gorm:"primaryKey;size:40"`
	DownstreamKey string    `gorm:"size:64;not null;uniqueIndex:redis_payments_downstream_key"`
	Account       string    `gorm:"size:64;not null;index:redis_payments_account_created,priority:1"`
	Amount        int64     `gorm:"not null"`
	Currency      string    `gorm:"size:3;not null"`
	Description   string    `gorm:"size:1000;not null"`
	Status        string    `gorm:"size:16;not null"`
	CreatedAt     time.Time `gorm:"precision:6;not null;index:redis_payments_account_created,priority:2"`
}

// redisPaymentsTable is redisPayment's table.
const redisPaymentsTable = "redis_payments"

func (redisPayment) TableName() string { return redisPaymentsTable }

func (r redisPayment) payment() Payment {
	return Payment{ID: r.ID, Account: r.Account, Amount: r.Amount, Currency: r.Currency, Description: r.Description,
		Status: r.Status, CreatedAt: r.CreatedAt.UTC()}
}

// openRedis connects to the Redis that cfg.dsn names (a redis:// URL; with
// addr= parameters, a Cluster) and to the payments database.
func openRedis(ctx context.Context, cfg config) (*backend, error) {
	client, where, err := redisClient(orDefault(cfg.dsn, defaultRedisURL))
	if err != nil {
		return nil, err
	}
	st, err := idemredis.New(client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	if err := st.Check(ctx); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("connect %s: %w", where, err)
	}
	db, dbWhere, closeDB, err := openPaymentsDB(ctx, orDefault(cfg.paymentsDB, defaultRedisPaymentsPath))
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	repo := redisRepo{db: db}
	return &backend{store: st, repo: repo,
		where: where + ", payments in " + dbWhere,
		close: func() { closeDB(); _ = client.Close() }}, nil
}

// redisClient parses a redis:// or rediss:// URL: a plain client, or a
// Cluster client when the URL names more nodes with addr= parameters
// (redis://127.0.0.1:7001?addr=127.0.0.1:7002&addr=127.0.0.1:7003).
func redisClient(dsn string) (redis.UniversalClient, string, error) {
	// go-redis logs each failed dial itself, several lines per error; the
	// store returns the same errors, which the service logs (or, at
	// start-up, prints as its one line).
	redis.SetLogger(discardRedisLog{})
	if strings.Contains(dsn, "addr=") {
		o, err := redis.ParseClusterURL(dsn)
		if err != nil {
			return nil, "", fmt.Errorf("invalid -dsn for redis: %w", err)
		}
		o.PoolSize = maxOpenConns * 2
		return redis.NewClusterClient(o), "redis cluster " + strings.Join(o.Addrs, ","), nil
	}
	o, err := redis.ParseURL(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("invalid -dsn for redis: %w", err)
	}
	o.PoolSize = maxOpenConns * 2
	return redis.NewClient(o), fmt.Sprintf("redis %s/%d", o.Addr, o.DB), nil
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// openPaymentsDB opens the payments database of -store redis: a
// postgres:// URL, or else an SQLite file path. It creates the table.
func openPaymentsDB(ctx context.Context, dsn string) (*gorm.DB, string, func(), error) {
	var (
		d     gorm.Dialector
		where string
	)
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		d, where = postgres.Open(dsn), redact(dsn)
	} else {
		if strings.ContainsAny(dsn, "?") || strings.HasPrefix(dsn, "file:") {
			return nil, "", nil, fmt.Errorf("invalid -payments-db %q: want a file path or a postgres:// URL", dsn)
		}
		abs, err := filepath.Abs(dsn)
		if err != nil {
			return nil, "", nil, fmt.Errorf("payments database path %q: %w", dsn, err)
		}
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return nil, "", nil, fmt.Errorf("payments database directory: %w", err)
		}
		d, where = sqlite.Open(idemgorm.SQLiteDSN(abs, 10*time.Second)), abs
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, "", nil, fmt.Errorf("open %s: %w", where, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, "", nil, err
	}
	sqlDB.SetMaxOpenConns(maxOpenConns)
	closeDB := func() { _ = sqlDB.Close() }
	if err := sqlDB.PingContext(ctx); err != nil {
		closeDB()
		return nil, "", nil, fmt.Errorf("connect %s: %w", where, err)
	}
	if err := db.WithContext(ctx).AutoMigrate(&redisPayment{}); err != nil {
		closeDB()
		return nil, "", nil, fmt.Errorf("migrate payments: %w", err)
	}
	return db, where, closeDB, nil
}

// redisRepo keeps the payments of -store redis. It is a keyedRepository:
// its write is idempotent by the request's downstream key and can be
// undone, because no transaction undoes it.
type redisRepo struct{ db *gorm.DB }

// Insert implements Repository for completeness; Create uses InsertOnce.
func (r redisRepo) Insert(ctx context.Context, p Payment) error {
	_, _, err := r.InsertOnce(ctx, p)
	return err
}

// InsertOnce writes p under the request's downstream key (inserted true),
// or, when a row with that key exists (an earlier attempt at the same
// request wrote it), writes nothing and returns that row: the same
// payment, the same answer.
func (r redisRepo) InsertOnce(ctx context.Context, p Payment) (_ Payment, inserted bool, _ error) {
	h, ok := idemredis.Tx(ctx)
	if !ok {
		return Payment{}, false, errNoTx
	}
	dk, err := idem.DownstreamKey(ctx, redisPaymentStep)
	if err != nil {
		return Payment{}, false, err
	}
	// Narrow the window in which an attempt whose lease ran out writes:
	// the unique column closes it.
	if err := h.CheckLease(ctx); err != nil {
		return Payment{}, false, err
	}
	row := redisPayment{ID: p.ID, DownstreamKey: dk, Account: p.Account, Amount: p.Amount, Currency: p.Currency,
		Description: p.Description, Status: p.Status, CreatedAt: p.CreatedAt}
	res := r.db.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(&row)
	if res.Error != nil {
		return Payment{}, false, res.Error
	}
	if res.RowsAffected == 1 {
		return p, true, nil
	}
	existing, found, err := r.byKey(ctx, p.Account, dk)
	if err != nil {
		return Payment{}, false, err
	}
	if !found {
		// ON CONFLICT DO NOTHING met another row than this key's (an id
		// collision): nothing was written.
		return Payment{}, false, errors.New("payment insert: a conflicting row that is not this request's")
	}
	if existing.Amount != p.Amount || existing.Currency != p.Currency || existing.Description != p.Description {
		// The record that would have refused another body for this key is
		// gone (expired after its retention, or lost by Redis), so the
		// engine's fingerprint check could not run: the row is the
		// remaining witness.
		return Payment{}, false, errKeyReused
	}
	return existing, false, nil
}

// errKeyReused: the request's downstream key has a payment with another
// amount, currency or description.
var errKeyReused = errors.New("payment insert: this key's payment has another body")

// Undo deletes the row the request's InsertOnce inserted. It runs on its own
// context: the request's may be cancelled already (the timeout).
func (r redisRepo) Undo(ctx context.Context, p Payment) error {
	dk, err := idem.DownstreamKey(ctx, redisPaymentStep)
	if err != nil {
		return err
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return r.db.WithContext(uctx).Where("downstream_key = ? AND id = ?", dk, p.ID).Delete(&redisPayment{}).Error
}

func (r redisRepo) byKey(ctx context.Context, account, dk string) (Payment, bool, error) {
	var rows []redisPayment
	if err := r.db.WithContext(ctx).Where("downstream_key = ? AND account = ?", dk, account).Limit(1).Find(&rows).Error; err != nil {
		return Payment{}, false, err
	}
	if len(rows) == 0 {
		return Payment{}, false, nil
	}
	return rows[0].payment(), true, nil
}

func (r redisRepo) List(ctx context.Context, account string) ([]Payment, error) {
	var rows []redisPayment
	err := r.db.WithContext(ctx).Where("account = ?", account).Order("created_at, id").Find(&rows).Error
	ps := make([]Payment, len(rows))
	for i, row := range rows {
		ps[i] = row.payment()
	}
	return ps, err
}

func (r redisRepo) Get(ctx context.Context, account, id string) (Payment, error) {
	var rows []redisPayment
	if err := r.db.WithContext(ctx).Where("account = ? AND id = ?", account, id).Limit(1).Find(&rows).Error; err != nil {
		return Payment{}, err
	}
	if len(rows) == 0 {
		return Payment{}, errNoPayment
	}
	return rows[0].payment(), nil
}

// keyedRepository is a Repository whose write is not undone with the
// idempotency record (idemredis: no shared transaction). Create writes
// through InsertOnce, which is idempotent by the request's downstream key
// and returns the payment as stored, and calls Undo when the request fails
// after its InsertOnce inserted the row. A row an earlier attempt wrote is
// never undone: its 201 may have been answered already.
type keyedRepository interface {
	InsertOnce(ctx context.Context, p Payment) (_ Payment, inserted bool, _ error)
	Undo(ctx context.Context, p Payment) error
}
