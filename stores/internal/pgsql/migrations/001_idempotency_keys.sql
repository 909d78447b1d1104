-- idem: idempotency records for github.com/idemgo/idem/stores/pgx.
--
-- One row per (principal, key). A row is created in_progress by the claim,
-- turned completed or failed by the settle (in the same transaction as the
-- handler's own writes), or released when the attempt is released: the key
-- is free again, and the row keeps its nonce for the next attempt's
-- downstream keys until it expires. An in_progress row whose attempt's
-- outcome is unknown is kept, marked uncertain. Times are PostgreSQL's
-- clock (now()), never the application's.
--
-- The table has no CHECK constraints: PostgreSQL 15 parses every CHECK
-- expression anew on each INSERT and UPDATE, and the five this table had
-- cost 27 % of the server's instructions on a first request (and were paid
-- by every replay's claim too). The store holds the same rules in Go
-- instead: it refuses a fingerprint over 255 bytes and a nonce over 64,
-- cuts the request id to idem.MaxRequestIDLength, and its statements are
-- the only writers of state and status. A table created with the CHECKs
-- works unchanged; drop them to get the cheaper claim.
--
-- This file creates the table under its default name, schema-qualified so
-- that it lands where the store looks whatever the search_path. For
-- another name, render the schema with (*idempgx.Store).Schema() for a store made with WithTable("your_schema.your_table")
-- instead of copying this file. The statements are idempotent (IF NOT
-- EXISTS).

CREATE TABLE IF NOT EXISTS public.idempotency_keys (
    principal   text        NOT NULL,
    key         text        NOT NULL,
    -- idem.Fingerprint: a version byte and an HMAC-SHA-256 of method, path,
    -- principal and body under the service's key; never the body.
    fingerprint bytea       NOT NULL,
    -- in_progress, completed, failed or released; status is NULL exactly
    -- when the row is in_progress or released.
    state       text        NOT NULL,
    -- Fences settle, release and keep: they only act while it still matches.
    lease_token text        NOT NULL,
    -- The first attempt's request id; idem bounds it to 255 bytes.
    request_id  text        NOT NULL DEFAULT '',
    -- Random per record, kept by a takeover, and by a release for the next
    -- claim with the same fingerprint: enters idem.DownstreamKey.
    nonce       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- When the current lease was taken, and when it ends: an in_progress
    -- row past its lease_expires_at is stale (its holder crashed, hung or
    -- was kept), whatever lease the next request asks for.
    locked_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz NOT NULL,
    -- Retention: past it the row counts as absent and may be purged.
    expires_at  timestamptz NOT NULL,
    -- The attempt's work may have committed without its outcome (kept by
    -- Keep): a takeover only to ask Config.Reconcile, which the takeover
    -- keeps; cleared by the settle and the release.
    uncertain   boolean     NOT NULL DEFAULT false,
    -- The stored response; present exactly when the row is settled.
    status      integer,
    -- Response headers, byte-exact, in idem.EncodeHeader's format.
    headers     bytea,
    body        bytea,
    PRIMARY KEY (principal, key)
);

-- Stale in_progress rows (crashed, hung or kept holders), the longest
-- expired lease first.
CREATE INDEX IF NOT EXISTS idempotency_keys_lease_expires_at_idx
    ON public.idempotency_keys (lease_expires_at) WHERE state = 'in_progress';

-- The sweeper's index for deleting expired settled rows in batches. It
-- leaves in_progress rows out: the claim then writes two index entries
-- instead of three (the settle, which cannot be a HOT update because it
-- changes state, writes this one and the primary key's). The sweeper finds
-- the few expired in_progress rows through the lease_expires_at index. A
-- table created with a full index on expires_at works unchanged; drop and
-- recreate the index to get the smaller claim.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx
    ON public.idempotency_keys (expires_at) WHERE state <> 'in_progress';
