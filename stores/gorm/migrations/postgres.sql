-- idem: idempotency records for PostgreSQL (stores/gorm, dialect "postgres").
-- Feed this file to your migration tool as it is, or call (*idemgorm.Store).Migrate.
-- The table name is idempotency_keys; Migrate renames the table and its indexes
-- when the store is created with WithTable.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   text        NOT NULL,
    "key"       text        NOT NULL,
    fingerprint bytea       NOT NULL,
    state       text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed')),
    lease_token text        NOT NULL,
    request_id  text        NOT NULL DEFAULT '',
    status      integer,
    headers     jsonb,
    body        bytea,
    created_at  timestamptz NOT NULL,
    locked_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (principal, "key"),
    CHECK ((state = 'in_progress') = (status IS NULL))
);

-- Stale leases (ListStale, takeover diagnostics): only in-progress rows.
CREATE INDEX IF NOT EXISTS idempotency_keys_stale_idx
    ON idempotency_keys (locked_at) WHERE state = 'in_progress';

-- The sweeper (PurgeExpired).
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx
    ON idempotency_keys (expires_at);
