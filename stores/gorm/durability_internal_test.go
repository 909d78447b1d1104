package idemgorm

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestPostgresClaimOnlyCommitsWithoutFlush: on PostgreSQL the claim
// statement turns synchronous_commit off for its own transaction and for
// nothing else: the session (one pooled connection here) keeps its setting,
// and so does the handler's transaction, whose settle commit flushes the
// claim with it.
func TestPostgresClaimOnlyCommitsWithoutFlush(t *testing.T) {
	dsn := os.Getenv("IDEM_PG_DSN")
	if dsn == "" {
		dsn = "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("PostgreSQL unreachable (IDEM_PG_DSN): %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(1) // every statement below shares one session
	t.Cleanup(func() { _ = sqlDB.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(db, WithTable("idem_dur_"+suffix()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE " + s.Table()) })
	show := func(tx *gorm.DB) string {
		var v string
		if err := tx.Raw("SHOW synchronous_commit").Scan(&v).Error; err != nil {
			t.Fatal(err)
		}
		return v
	}
	server := show(db)
	if server == "off" {
		t.Fatal("the test server runs with synchronous_commit=off; this test needs it on")
	}

	var inClaim string
	err = db.Transaction(func(tx *gorm.DB) error {
		r := req("dur-"+suffix(), "body", "tok-"+suffix(), time.Minute, time.Hour)
		rows, err := tx.Raw(s.q.claimPG, s.q.lockTimeoutPG, r.Principal, r.Key, r.Fingerprint, r.Token, r.RequestID, r.Nonce,
			r.Lease.Microseconds(), r.Retention.Microseconds(), r.Principal, r.Key).Rows()
		if err != nil {
			return err
		}
		_ = rows.Close()
		inClaim = show(tx)
		return gorm.ErrInvalidTransaction // roll back
	}, &sql.TxOptions{})
	if err != gorm.ErrInvalidTransaction {
		t.Fatal(err)
	}
	if inClaim != "off" {
		t.Fatalf("synchronous_commit in the claim's transaction = %q, want off", inClaim)
	}

	// Sync, which idem.DownstreamKey calls before it hands out a key, makes
	// the claims so far durable: right after it the flushed WAL covers them.
	// Five claims, each checked within milliseconds, well inside the WAL
	// writer's 200 ms delay.
	for i := range 5 {
		r := req("dur-"+suffix(), "body", "tok-"+suffix(), time.Minute, time.Hour)
		if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		var claimed string // at or past the claim's commit record
		if err := db.Raw("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").Scan(&claimed).Error; err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(ctx); err != nil {
			t.Fatalf("sync: %v", err)
		}
		var durable bool
		if err := db.Raw("SELECT pg_catalog.pg_current_wal_flush_lsn() >= CAST(? AS pg_lsn)", claimed).Scan(&durable).Error; err != nil {
			t.Fatal(err)
		}
		if !durable {
			t.Fatalf("claim %d: Sync returned before its WAL (up to %s) was flushed", i, claimed)
		}
	}

	r := req("dur-"+suffix(), "body", "tok-"+suffix(), time.Minute, time.Hour)
	if res, err := s.Claim(ctx, r); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if got := show(db); got != server {
		t.Fatalf("synchronous_commit after a claim = %q, want the session's %q", got, server)
	}
	txCtx, tx, err := s.BeginTx(ctx, idem.Lease{Principal: r.Principal, Key: r.Key, Token: r.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	htx, _ := Tx(txCtx)
	if got := show(htx); got != server {
		t.Fatalf("synchronous_commit in the handler's transaction = %q, want %q", got, server)
	}
}
