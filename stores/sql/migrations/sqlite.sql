-- idem: idempotency records for SQLite 3.37+ (stores/gorm, dialect "sqlite").
-- Feed this file to your migration tool as it is, or call (*idemgorm.Store).Migrate.
-- The table name is idempotency_keys; Migrate renames the table and its indexes
-- when the store is created with WithTable.
--
-- SQLite has no timestamp type: times are INTEGER unix microseconds, written
-- from the database's clock ('now'), exact and cheap to compare. STRICT makes
-- SQLite refuse a value of the wrong type instead of storing it. principal, key and
-- request_id hold 255 bytes each, as on every dialect; headers are idem.EncodeHeader's
-- bytes. uncertain (0 or 1) is set, only on an in-progress row, when an attempt's work
-- may have committed without its outcome.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   TEXT    NOT NULL CHECK (length(CAST(principal AS BLOB)) <= 255),
    "key"       TEXT    NOT NULL CHECK (length(CAST("key" AS BLOB)) <= 255),
    fingerprint BLOB    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed', 'released')),
    lease_token TEXT    NOT NULL,
    request_id  TEXT    NOT NULL DEFAULT '' CHECK (length(CAST(request_id AS BLOB)) <= 255),
    nonce       TEXT    NOT NULL CHECK (length(CAST(nonce AS BLOB)) <= 64),
    status      INTEGER,
    headers     BLOB,
    body        BLOB,
    created_at  INTEGER NOT NULL,
    locked_at   INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    uncertain   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, "key"),
    CHECK ((state IN ('in_progress', 'released')) = (status IS NULL))
) STRICT;

-- Stale leases (ListStale): only in-progress rows, by the end of their lease.
CREATE INDEX IF NOT EXISTS idempotency_keys_lease_idx
    ON idempotency_keys (lease_expires_at) WHERE state = 'in_progress';

-- The sweeper (PurgeExpired).
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx
    ON idempotency_keys (expires_at);
