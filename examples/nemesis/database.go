package main

import (
	"context"
	"database/sql"
	"fmt"
)

// database is the server a store's round runs on: the run's PostgreSQL
// cluster (cluster) or its MariaDB server (mariadb). Both listen only on
// the namespace's address, where the faults reach them, and both are read
// by the checker over a Unix socket, where no fault does.
type database interface {
	start(ctx context.Context) error
	// crash ends the server without a shutdown: what it had not flushed
	// is gone.
	crash(ctx context.Context) error
	// stop crashes the server if it runs; used by the clean-up.
	stop() error
	// listenPort is the TCP port it listens on, in the namespace.
	listenPort() int
	// recreate drops database name, if any, and creates it empty.
	recreate(ctx context.Context, name string) error
	// serviceDSN is the -dsn of a service reaching database name at addr
	// (its proxy).
	serviceDSN(addr, name string) string
	// readRows reads database name's payments (account, id, oldest first)
	// and records (principal, state or "uncertain") over the socket.
	readRows(ctx context.Context, name string, st *dbState) error
}

// scanPairs appends the two-column rows of query to add.
func scanPairs(ctx context.Context, db *sql.DB, query string, add func(a, b string)) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return fmt.Errorf("%s: %w", query, err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			return err
		}
		add(a, b)
	}
	return rows.Err()
}

// The checker's queries, the same on both servers.
const (
	paymentsQuery = `SELECT account, id FROM payments ORDER BY created_at`
	recordsQuery  = `SELECT principal, CASE WHEN uncertain THEN 'uncertain' ELSE state END FROM idempotency_keys`
)

// readState reads what db holds of database name, and the provider's
// charges.
func readState(ctx context.Context, db database, name string, provider *instance) (dbState, error) {
	st := dbState{payments: map[string][]string{}, records: map[string]string{}}
	if err := db.readRows(ctx, name, &st); err != nil {
		return st, fmt.Errorf("read the history: %w", err)
	}
	if provider != nil {
		var err error
		if st.charges, err = charges(ctx, provider.base()); err != nil {
			return st, err
		}
	}
	return st, nil
}
