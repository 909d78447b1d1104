-- idem: idempotency records for PostgreSQL (stores/gorm, dialect "postgres").
-- Feed this file to your migration tool as it is, or call (*idemgorm.Store).Migrate.
-- The table name is idempotency_keys; Migrate renames the table and its indexes
-- when the store is created with WithTable.
--
-- principal, key and request_id hold at most 255 bytes each (idem.MaxPrincipalLength,
-- MaxKeyLengthLimit, MaxRequestIDLength), the same on every dialect. Headers are
-- idem.EncodeHeader's bytes: byte-exact, whatever the header values contain.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   text        NOT NULL CHECK (octet_length(principal) <= 255),
    "key"       text        NOT NULL CHECK (octet_length("key") <= 255),
    fingerprint bytea       NOT NULL,
    state       text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed', 'released')),
    lease_token text        NOT NULL,
    request_id  text        NOT NULL DEFAULT '' CHECK (octet_length(request_id) <= 255),
    nonce       text        NOT NULL CHECK (octet_length(nonce) <= 64),
    status      integer,
    headers     bytea,
    body        bytea,
    created_at  timestamptz NOT NULL,
    locked_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (principal, "key"),
    CHECK ((state IN ('in_progress', 'released')) = (status IS NULL))
);

-- Stale leases (ListStale, takeover diagnostics): only in-progress rows.
CREATE INDEX IF NOT EXISTS idempotency_keys_stale_idx
    ON idempotency_keys (locked_at) WHERE state = 'in_progress';

-- The sweeper (PurgeExpired), settled rows only: the claim writes two index
-- entries instead of three. Expired in-progress rows (abandoned claims, few)
-- are found through the stale index. A table made with the earlier full
-- index works unchanged; recreate the index to get the smaller claim.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx
    ON idempotency_keys (expires_at) WHERE state <> 'in_progress';
