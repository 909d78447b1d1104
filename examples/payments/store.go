package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idempgx "github.com/idemgo/idem/stores/pgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// backend is the store choice, made once: the idemstore.Store and the payments
// repository that writes through that store's transaction.
type backend struct {
	store idemstore.Store
	repo  Repository
	// reconcile, when set, is the engine's Config.Reconcile.
	reconcile idem.Reconciler
	// where says, for the start-up log line, which database is used.
	where string
	close func()
}

// openBackend opens the database cfg names, creates the idempotency and
// payments tables if they are missing, and returns the backend.
func openBackend(ctx context.Context, cfg config) (*backend, error) {
	switch cfg.store {
	case "memory":
		s, err := memstore.New()
		if err != nil {
			return nil, err
		}
		return &backend{store: s, repo: newMemRepo(), where: "memory (lost on exit)", close: func() {}}, nil
	case "redis":
		return openRedis(ctx, cfg)
	case "pgx":
		return openPgx(ctx, orDefault(cfg.dsn, defaultPostgresDSN), cfg.waitInFlight > 0)
	case "sqlite":
		path := orDefault(cfg.dsn, defaultSQLitePath)
		if strings.ContainsAny(path, "?") || strings.HasPrefix(path, "file:") {
			return nil, fmt.Errorf("invalid -dsn for sqlite %q: want a file path; the connection options are set by the service", path)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("sqlite path %q: %w", path, err)
		}
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return nil, fmt.Errorf("sqlite directory: %w", err)
		}
		return openGorm(ctx, sqlite.Open(idemgorm.SQLiteDSN(abs, 10*time.Second)), abs)
	case "gorm-postgres":
		dsn := orDefault(cfg.dsn, defaultPostgresDSN)
		return openGorm(ctx, postgres.Open(dsn), redact(dsn))
	case "gorm-mysql":
		mc, err := mysql.ParseDSN(orDefault(cfg.dsn, defaultMySQLDSN))
		if err != nil {
			return nil, fmt.Errorf("invalid -dsn for gorm-mysql: %w", err)
		}
		// The payments table scans DATETIME into time.Time, in UTC.
		mc.ParseTime, mc.Loc = true, time.UTC
		where := mc.Addr + "/" + mc.DBName
		return openGorm(ctx, gormmysql.New(gormmysql.Config{DSNConfig: mc}), "mysql "+where)
	}
	return nil, fmt.Errorf("unknown store %q", cfg.store)
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// redact drops the password from a URL DSN for the log line.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return "(dsn)"
	}
	return u.Redacted()
}

// maxOpenConns bounds each connection pool. Keep it above one: a request
// holds a connection for its idempotency transaction while others claim
// and read with others.
const maxOpenConns = 10

// --- GORM: SQLite, PostgreSQL, MySQL/MariaDB ---

func openGorm(ctx context.Context, d gorm.Dialector, where string) (*backend, error) {
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", where, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxOpenConns)
	closeDB := func() { _ = sqlDB.Close() }
	if err := sqlDB.PingContext(ctx); err != nil {
		closeDB()
		return nil, fmt.Errorf("connect %s: %w", where, err)
	}
	st, err := idemgorm.New(db)
	if err != nil {
		closeDB()
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		closeDB()
		return nil, err
	}
	if err := db.WithContext(ctx).AutoMigrate(&Payment{}); err != nil {
		closeDB()
		return nil, fmt.Errorf("migrate payments: %w", err)
	}
	return &backend{store: st, repo: gormRepo{db: db}, where: where, close: closeDB}, nil
}

// gormRepo keeps payments through GORM. Writes go through
// idemgorm.Tx(ctx): the idempotency transaction.
type gormRepo struct{ db *gorm.DB }

func (r gormRepo) Insert(ctx context.Context, p Payment) error {
	tx, ok := idemgorm.Tx(ctx)
	if !ok {
		return errNoTx
	}
	return tx.Create(&p).Error
}

func (r gormRepo) List(ctx context.Context, account string) ([]Payment, error) {
	var ps []Payment
	err := r.db.WithContext(ctx).Where("account = ?", account).Order("created_at, id").Find(&ps).Error
	for i := range ps {
		ps[i].CreatedAt = ps[i].CreatedAt.UTC()
	}
	return ps, err
}

func (r gormRepo) Get(ctx context.Context, account, id string) (Payment, error) {
	var ps []Payment
	if err := r.db.WithContext(ctx).Where("account = ? AND id = ?", account, id).Limit(1).Find(&ps).Error; err != nil {
		return Payment{}, err
	}
	if len(ps) == 0 {
		return Payment{}, errNoPayment
	}
	ps[0].CreatedAt = ps[0].CreatedAt.UTC()
	return ps[0], nil
}

// --- pgx: PostgreSQL ---

// paymentsDDL matches the table GORM creates for Payment on PostgreSQL, so
// the pgx and gorm-postgres stores can share a database.
const paymentsDDL = `
CREATE TABLE IF NOT EXISTS payments (
	id          varchar(40) PRIMARY KEY,
	account     varchar(64) NOT NULL,
	amount      bigint NOT NULL,
	currency    varchar(3) NOT NULL,
	description varchar(1000) NOT NULL,
	status      varchar(16) NOT NULL,
	created_at  timestamptz(6) NOT NULL
);
CREATE INDEX IF NOT EXISTS payments_account_created ON payments (account, created_at)`

// openPgx opens the pgx store; with notify (-wait-in-flight), its settles
// wake the duplicates waiting on other instances by NOTIFY.
func openPgx(ctx context.Context, dsn string, notify bool) (*backend, error) {
	where := redact(dsn)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("invalid -dsn for pgx: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// Each idempotent request holds a connection for its transaction
		// while other requests claim with another: more than pgxpool's
		// default of max(4, CPUs).
		pc.MaxConns = maxOpenConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect %s: %w", where, err)
	}
	var opts []idempgx.Option
	if notify {
		opts = append(opts, idempgx.WithNotifications())
	}
	st, err := idempgx.New(pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, paymentsDDL); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate payments: %w", err)
	}
	return &backend{store: st, repo: pgxRepo{pool: pool}, where: where, close: pool.Close}, nil
}

// pgxRepo keeps payments through pgx. Writes go through idempgx.Tx(ctx),
// the handle on the idempotency transaction: the store commits them with
// the stored response, and an error returned rolls them back (the handle
// has no Commit or Rollback).
type pgxRepo struct{ pool *pgxpool.Pool }

const paymentCols = "id, amount, currency, description, status, created_at"

func (r pgxRepo) Insert(ctx context.Context, p Payment) error {
	tx, ok := idempgx.Tx(ctx)
	if !ok {
		return errNoTx
	}
	_, err := tx.Exec(ctx, `INSERT INTO payments (id, account, amount, currency, description, status, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, p.ID, p.Account, p.Amount, p.Currency, p.Description, p.Status, p.CreatedAt)
	return err
}

func (r pgxRepo) List(ctx context.Context, account string) ([]Payment, error) {
	rows, err := r.pool.Query(ctx, "SELECT "+paymentCols+" FROM payments WHERE account = $1 ORDER BY created_at, id", account)
	if err != nil {
		return nil, err
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Payment, error) { return scanPayment(row) })
	for i := range ps {
		ps[i].Account = account
	}
	return ps, err
}

func (r pgxRepo) Get(ctx context.Context, account, id string) (Payment, error) {
	p, err := scanPayment(r.pool.QueryRow(ctx, "SELECT "+paymentCols+" FROM payments WHERE account = $1 AND id = $2", account, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, errNoPayment
	}
	p.Account = account
	return p, err
}

func scanPayment(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.Amount, &p.Currency, &p.Description, &p.Status, &p.CreatedAt)
	p.CreatedAt = p.CreatedAt.UTC()
	return p, err
}

// --- memory ---

// memRepo keeps payments in a map. Insert registers the write with the
// memstore transaction's OnCommit, so a payment appears only when its
// outcome is committed.
type memRepo struct {
	mu       sync.Mutex
	payments map[string][]Payment // account → payments, oldest first
}

func newMemRepo() *memRepo { return &memRepo{payments: make(map[string][]Payment)} }

func (r *memRepo) Insert(ctx context.Context, p Payment) error {
	tx, ok := memstore.Tx(ctx)
	if !ok {
		return errNoTx
	}
	tx.OnCommit(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.payments[p.Account] = append(r.payments[p.Account], p)
	})
	return nil
}

func (r *memRepo) List(_ context.Context, account string) ([]Payment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.payments[account]), nil
}

func (r *memRepo) Get(_ context.Context, account, id string) (Payment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.payments[account] {
		if p.ID == id {
			return p, nil
		}
	}
	return Payment{}, errNoPayment
}
