-- idempgx's replay as PostgreSQL sees it: the claim of idempgx.sql, pipelined
-- behind its prelude, for a key that exists ('pgb-replay-<client>', inserted
-- by each client's first transaction): the INSERT meets the row and writes
-- nothing, and the SELECT returns it. One round trip.
\startpipeline
SELECT pg_catalog.set_config('lock_timeout', '2000ms', true),
	pg_catalog.set_config('statement_timeout', '4000ms', true),
	pg_catalog.set_config('synchronous_commit', 'off', true);
INSERT INTO "idem_bench"."pgx_keys" (principal, key, fingerprint, state, lease_token, request_id, nonce,
	created_at, locked_at, lease_expires_at, expires_at, uncertain)
VALUES ('acct', 'pgb-replay-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', 'req', '0123456789abcdef0123456789abcdef', pg_catalog.now(), pg_catalog.now(),
	pg_catalog.now() OPERATOR(pg_catalog.+) (40000000::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'),
	pg_catalog.now() OPERATOR(pg_catalog.+) (86400000000::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'), false)
ON CONFLICT (principal, key) DO NOTHING;
SELECT principal, key, fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body, pg_catalog.now() FROM "idem_bench"."pgx_keys" WHERE principal OPERATOR(pg_catalog.=) 'acct' AND key OPERATOR(pg_catalog.=) ('pgb-replay-' || :client_id);
\endpipeline
