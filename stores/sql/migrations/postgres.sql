-- idem: idempotency records for PostgreSQL (stores/gorm, dialect "postgres").
-- Feed this file to your migration tool as it is, or call (*idemgorm.Store).Migrate.
-- The table name is idempotency_keys; Migrate renames the table and its indexes
-- when the store is created with WithTable.
--
-- principal, key and request_id hold at most 255 bytes each (idem.MaxPrincipalLength,
-- MaxKeyLengthLimit, MaxRequestIDLength), the same on every dialect. Headers are
-- idem.EncodeHeader's bytes: byte-exact, whatever the header values contain.
--
-- Unlike the MySQL and SQLite tables, this one has no CHECK constraints:
-- PostgreSQL parses every CHECK expression anew on each INSERT and UPDATE,
-- which made them a quarter of the server's work on a first request. The
-- store holds the same bounds before it writes (it refuses an over-long
-- principal, key, fingerprint, token or nonce, and cuts the request id), and
-- its statements are the only writers of state and status. A table created
-- with the CHECKs works unchanged; drop them to get the cheaper claim.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    principal   text        NOT NULL,
    "key"       text        NOT NULL,
    fingerprint bytea       NOT NULL,
    -- in_progress, completed, failed or released; status is NULL exactly
    -- when the row is in_progress or released.
    state       text        NOT NULL,
    lease_token text        NOT NULL,
    request_id  text        NOT NULL DEFAULT '',
    nonce       text        NOT NULL,
    status      integer,
    headers     bytea,
    body        bytea,
    created_at  timestamptz NOT NULL,
    -- when the current lease was taken, and when it ends: past
    -- lease_expires_at an in-progress record is stale.
    locked_at        timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- set (only on an in-progress row) when an attempt's work may have
    -- committed without its outcome: only a takeover that asks Reconcile
    -- takes it over.
    uncertain   boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (principal, "key")
);

-- Stale leases (ListStale): only in-progress rows, by the end of their lease.
CREATE INDEX IF NOT EXISTS idempotency_keys_lease_idx
    ON idempotency_keys (lease_expires_at) WHERE state = 'in_progress';

-- The sweeper (PurgeExpired), settled rows only: the claim writes two index
-- entries instead of three. Expired in-progress rows (abandoned claims, few)
-- are found through the lease index, which holds only in-progress rows.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx
    ON idempotency_keys (expires_at) WHERE state <> 'in_progress';
