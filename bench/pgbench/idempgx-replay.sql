-- idempgx's replay as PostgreSQL sees it: the claim of idempgx.sql, pipelined
-- behind its prelude, for a key that exists ('pgb-replay-<client>', inserted
-- by each client's first transaction): the INSERT meets the row and writes
-- nothing, and the SELECT returns it. One round trip.
\startpipeline
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true),
	pg_catalog.set_config('lock_timeout', '2000ms', true),
	pg_catalog.set_config('statement_timeout', '4000ms', true),
	pg_catalog.set_config('synchronous_commit', 'off', true);
INSERT INTO "idem_bench"."pgx_keys" (principal, key, fingerprint, state, lease_token, request_id, nonce,
	created_at, locked_at, lease_expires_at, expires_at, uncertain)
VALUES ('acct', 'pgb-replay-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', 'req', '0123456789abcdef0123456789abcdef', now(), now(), now() + 40000000::bigint * interval '1 microsecond',
	now() + 86400000000::bigint * interval '1 microsecond', false)
ON CONFLICT (principal, key) DO NOTHING;
SELECT principal, key, fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body, now() FROM "idem_bench"."pgx_keys" WHERE principal = 'acct' AND key = 'pgb-replay-' || :client_id;
\endpipeline
