package ctl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	idem "github.com/idemgo/idem/core"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	idempgx "github.com/idemgo/idem/stores/pgx"
	idemredis "github.com/idemgo/idem/stores/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Opened is a store Open opened: the store, a description of it for the
// output, and the function that closes its connections.
type Opened struct {
	Store idem.Store
	// Name describes the store without credentials: "postgres
	// "public"."idempotency_keys"", "redis 127.0.0.1:6379 prefix idem:".
	Name  string
	Close func()
}

// checker is the start-up check every store of this repository has.
type checker interface {
	Check(ctx context.Context) error
}

// Open opens the store dsn names, by its scheme:
//
//	postgres://… or postgresql://…  idempgx (pgx), table from table
//	mysql://user:pass@host:port/db  idemgorm on MySQL or MariaDB
//	sqlite:PATH                     idemgorm on the SQLite file PATH
//	redis://… or rediss://…         idemredis, key prefix from prefix
//
// table and prefix may be empty for the store's default. Open checks the
// store (its table exists with the expected columns, the server answers)
// and creates nothing. An unknown scheme is a usage error.
func Open(ctx context.Context, dsn, table, prefix string) (*Opened, error) {
	scheme, _, ok := strings.Cut(dsn, ":")
	if !ok || dsn == "" {
		return nil, fmt.Errorf("%w: --dsn %q has no scheme (postgres://, mysql://, sqlite:, redis://)", ErrUsage, redactDSN(dsn))
	}
	if prefix != "" && scheme != "redis" && scheme != "rediss" {
		return nil, fmt.Errorf("%w: --prefix names a Redis store's keys; a SQL store takes --table", ErrUsage)
	}
	if table != "" && (scheme == "redis" || scheme == "rediss") {
		return nil, fmt.Errorf("%w: --table names a SQL store's table; a Redis store takes --prefix", ErrUsage)
	}
	var (
		o   *Opened
		err error
	)
	switch scheme {
	case "postgres", "postgresql":
		o, err = openPgx(ctx, dsn, table)
	case "mysql":
		o, err = openMySQL(ctx, dsn, table)
	case "sqlite":
		o, err = openSQLite(ctx, strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//"), table)
	case "redis", "rediss":
		o, err = openRedis(ctx, dsn, prefix)
	default:
		return nil, fmt.Errorf("%w: --dsn scheme %q: want postgres://, mysql://, sqlite: or redis://", ErrUsage, scheme)
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

// redactDSN drops a password from a URL DSN for messages.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return dsn
}

func openPgx(ctx context.Context, dsn, table string) (*Opened, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: --dsn: %v", ErrUsage, err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", redactDSN(dsn), err)
	}
	var opts []idempgx.Option
	if table != "" {
		opts = append(opts, idempgx.WithTable(table))
	}
	s, err := idempgx.New(pool, opts...)
	if err != nil {
		pool.Close()
		if table != "" && !errors.Is(err, idem.ErrTransient) {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		return nil, err
	}
	return &Opened{Store: s, Name: "postgres " + s.Table(), Close: pool.Close}, nil
}

// mysqlDSN turns mysql://user:pass@host:port/db?params into the driver's
// user:pass@tcp(host:port)/db?params.
func mysqlDSN(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr = u.Hostname() + ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", errors.New("no database in the path (mysql://user@host:3306/DB)")
	}
	if len(u.RawQuery) > 0 {
		params := map[string]string{}
		for k, v := range u.Query() {
			params[k] = v[len(v)-1]
		}
		cfg.Params = params
	}
	return cfg.FormatDSN(), nil
}

func openGorm(ctx context.Context, d gorm.Dialector, table, where string) (*Opened, error) {
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
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		return nil, err
	}
	return &Opened{Store: s, Name: s.Dialect() + " " + s.Table(), Close: closeDB}, nil
}

func openMySQL(ctx context.Context, dsn, table string) (*Opened, error) {
	d, err := mysqlDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: --dsn %s: %v", ErrUsage, redactDSN(dsn), err)
	}
	return openGorm(ctx, gormmysql.Open(d), table, redactDSN(dsn))
}

func openSQLite(ctx context.Context, path, table string) (*Opened, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: --dsn sqlite: needs a file path (sqlite:/var/lib/app/idem.db)", ErrUsage)
	}
	return openGorm(ctx, sqlite.Open(idemgorm.SQLiteDSN(path, 5*time.Second)), table, "sqlite "+path)
}

func openRedis(ctx context.Context, dsn, prefix string) (*Opened, error) {
	opt, err := redis.ParseURL(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: --dsn %s: %v", ErrUsage, redactDSN(dsn), err)
	}
	client := redis.NewClient(opt)
	var opts []idemredis.Option
	if prefix != "" {
		opts = append(opts, idemredis.WithPrefix(prefix))
	}
	s, err := idemredis.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	_ = ctx
	return &Opened{Store: s, Name: "redis " + opt.Addr + " prefix " + s.Prefix(), Close: func() { _ = client.Close() }}, nil
}
