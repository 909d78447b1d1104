// Package open opens the store a parsed --dsn names, with this
// repository's stores: it is the ctl.Opener idemctl runs with, and the only
// package of idemctl that imports the stores.
package open

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
	"github.com/idemgo/idem/core/idemstore"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idempgx "github.com/idemgo/idem/stores/pgx"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

var _ ctl.Opener = Store

// checker is the start-up check every store of this repository has.
type checker interface {
	Check(ctx context.Context) error
}

// Store opens the store d names:
//
//	dsn.Postgres  idempgx (pgx), table from table
//	dsn.MySQL     idemgorm on MySQL or MariaDB
//	dsn.SQLite    idemgorm on the SQLite file
//	dsn.Redis     idemredis, key prefix from prefix
//
// table and prefix may be empty for the store's default. Store checks the
// store (its table exists with the expected columns, the server answers)
// and creates nothing. Its errors name the DSN redacted (d.Redacted); the
// caller scrubs what a driver may have quoted (d.Scrub).
func Store(ctx context.Context, d dsn.DSN, table, prefix string) (*ctl.Opened, error) {
	opened.Lock()
	opened.dsns = append(opened.dsns, d)
	opened.Unlock()
	var (
		o   *ctl.Opened
		err error
	)
	switch d.Kind {
	case dsn.Postgres:
		o, err = openPgx(ctx, d, table)
	case dsn.MySQL:
		o, err = openGorm(ctx, gormmysql.Open(d.Driver), table, d.Redacted)
	case dsn.SQLite:
		o, err = openGorm(ctx, sqlite.Open(idemgorm.SQLiteDSN(d.Driver, 5*time.Second)), table, "sqlite "+d.Driver)
	case dsn.Redis:
		o, err = openRedis(d, prefix)
	default:
		return nil, fmt.Errorf("%w: no store for DSN kind %q", ctl.ErrUsage, d.Kind)
	}
	if err != nil {
		return nil, err
	}
	if c, ok := o.Store.(checker); ok {
		if err := c.Check(ctx); err != nil {
			o.Close()
			return nil, fmt.Errorf("check %s: %w", o.Name, err)
		}
	}
	return o, nil
}

// logOutput receives the drivers' own log lines.
var logOutput io.Writer = os.Stderr

// opened holds the DSNs Store was given, whose passwords every driver log
// line is scrubbed of.
var opened struct {
	sync.Mutex
	dsns []dsn.DSN
}

// The log lines go-sql-driver and go-redis write themselves (a broken
// connection, a failed dial) go through driverLog, so that no log line
// carries a password either. The loggers are set here, before any
// connection can log, as the drivers' globals want. pgx and gorm log
// nothing: pgx has no logger by default, gorm's is Discard.
func init() {
	_ = mysql.SetLogger(driverLog{})
	redis.SetLogger(driverLog{})
}

// driverLog is a driver's logger that writes each line to logOutput,
// scrubbed of the passwords of every DSN opened.
type driverLog struct{}

func (driverLog) line(s string) {
	opened.Lock()
	defer opened.Unlock()
	for _, d := range opened.dsns {
		s = d.ScrubText(s)
	}
	fmt.Fprintln(logOutput, "idemctl:", strings.TrimRight(dsn.Redact(s), "\n"))
}

// Print implements go-sql-driver's mysql.Logger.
func (l driverLog) Print(v ...any) { l.line("mysql: " + fmt.Sprint(v...)) }

// Printf implements go-redis's logger.
func (l driverLog) Printf(_ context.Context, format string, v ...any) {
	l.line(fmt.Sprintf(format, v...))
}

func openPgx(ctx context.Context, d dsn.DSN, table string) (*ctl.Opened, error) {
	pc, err := pgxpool.ParseConfig(d.Driver)
	if err != nil {
		return nil, fmt.Errorf("%w: --dsn %s: %v", ctl.ErrUsage, d.Redacted, err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", d.Redacted, err)
	}
	var opts []idempgx.Option
	if table != "" {
		opts = append(opts, idempgx.WithTable(table))
	}
	s, err := idempgx.New(pool, opts...)
	if err != nil {
		pool.Close()
		if table != "" && !errors.Is(err, idemstore.ErrTransient) {
			return nil, fmt.Errorf("%w: %v", ctl.ErrUsage, err)
		}
		return nil, err
	}
	return &ctl.Opened{Store: s, Name: "postgres " + s.Table(), Close: pool.Close}, nil
}

func openGorm(ctx context.Context, d gorm.Dialector, table, where string) (*ctl.Opened, error) {
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", where, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(2)
	closeDB := func() { _ = sqlDB.Close() }
	if err := sqlDB.PingContext(ctx); err != nil {
		closeDB()
		return nil, fmt.Errorf("connect %s: %w", where, err)
	}
	var opts []idemgorm.Option
	if table != "" {
		opts = append(opts, idemgorm.WithTable(table))
	}
	s, err := idemgorm.New(db, opts...)
	if err != nil {
		closeDB()
		if table != "" {
			return nil, fmt.Errorf("%w: %v", ctl.ErrUsage, err)
		}
		return nil, err
	}
	return &ctl.Opened{Store: s, Name: s.Dialect() + " " + s.Table(), Close: closeDB}, nil
}

func openRedis(d dsn.DSN, prefix string) (*ctl.Opened, error) {
	opt, err := redis.ParseURL(d.Driver)
	if err != nil {
		return nil, fmt.Errorf("%w: --dsn %s: %v", ctl.ErrUsage, d.Redacted, err)
	}
	client := redis.NewClient(opt)
	var opts []idemredis.Option
	if prefix != "" {
		opts = append(opts, idemredis.WithPrefix(prefix))
	}
	s, err := idemredis.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %v", ctl.ErrUsage, err)
	}
	return &ctl.Opened{Store: s, Name: "redis " + opt.Addr + " prefix " + s.Prefix(), Close: func() { _ = client.Close() }}, nil
}
