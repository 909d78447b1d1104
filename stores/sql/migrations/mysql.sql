-- idem: idempotency records for MySQL 8 and MariaDB 10.5+ (stores/gorm, dialect "mysql").
-- Feed this file to your migration tool as it is, or call (*idemgorm.Store).Migrate.
-- The table name is idempotency_keys; Migrate renames the table and its indexes
-- when the store is created with WithTable.
--
-- principal and key are VARBINARY: compared byte for byte. A case-insensitive
-- or PAD SPACE collation would make "Key" and "key" (or "a" and "a ") the same
-- idempotency key, and the second request would be answered with the first's
-- response. Times are DATETIME(6) in UTC, written with UTC_TIMESTAMP(6) and
-- read as microseconds, so neither the session time zone nor the driver's
-- parseTime/loc settings change them. MySQL has no partial index: the lease
-- index is (state, lease_expires_at), for ListStale. uncertain is set (only on an
-- in-progress row) when an attempt's work may have committed without its outcome. principal, key and request_id hold 255 bytes each,
-- as on every dialect; headers are idem.EncodeHeader's bytes. Names are quoted
-- with backticks, which read the same under ANSI_QUOTES.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   VARBINARY(255) NOT NULL,
    `key`       VARBINARY(255) NOT NULL,
    fingerprint VARBINARY(255) NOT NULL,
    state       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    lease_token VARBINARY(255) NOT NULL,
    request_id  VARBINARY(255) NOT NULL,
    nonce       VARBINARY(64)  NOT NULL,
    status      INT            NULL,
    headers     LONGBLOB       NULL,
    body        LONGBLOB       NULL,
    created_at  DATETIME(6)    NOT NULL,
    locked_at   DATETIME(6)    NOT NULL,
    lease_expires_at DATETIME(6) NOT NULL,
    expires_at  DATETIME(6)    NOT NULL,
    uncertain   BOOLEAN        NOT NULL DEFAULT FALSE,
    PRIMARY KEY (principal, `key`),
    KEY idempotency_keys_lease_idx (state, lease_expires_at),
    KEY idempotency_keys_expires_idx (expires_at),
    CONSTRAINT idempotency_keys_state_chk CHECK (state IN ('in_progress', 'completed', 'failed', 'released')),
    CONSTRAINT idempotency_keys_status_chk CHECK ((state IN ('in_progress', 'released')) = (status IS NULL))
) ENGINE=InnoDB;
