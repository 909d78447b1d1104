-- idempgx's first request as PostgreSQL sees it (the statements of
-- stores/internal/pgsql/statements.go and stores/pgx/tx.go, with the
-- default lock and statement timeouts and idem's default lease of 40 s;
-- keep them in step): the claim's INSERT and SELECT pipelined behind the
-- statement that pins the session settings they depend on; BEGIN, the
-- statement that sets the WAL position Sync waits for and the lease marker
-- (on a connection's first transaction it sets the keepalive settings too,
-- which this script, like the store's later transactions, leaves out) and
-- the payment INSERT, pipelined; the marker check with the pinned
-- settings (synchronous_commit and the keepalive settings included), the
-- fenced settle and COMMIT pipelined: three round trips. Table from the pgx
-- store's Migrate (idem_bench.pgx_keys). pgbench -M prepared sends the
-- marker as a literal where idempgx binds it; callgrind.sh -variants counts
-- the stores' own statements.
\set k random(1, 2000000000)
\startpipeline
SELECT pg_catalog.set_config('lock_timeout', '2000ms', true),
	pg_catalog.set_config('statement_timeout', '4000ms', true),
	pg_catalog.set_config('synchronous_commit', 'off', true);
INSERT INTO "idem_bench"."pgx_keys" (principal, key, fingerprint, state, lease_token, request_id, nonce,
	created_at, locked_at, lease_expires_at, expires_at, uncertain)
VALUES ('acct', 'pgb-' || :k || '-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', 'req', '0123456789abcdef0123456789abcdef', pg_catalog.now(), pg_catalog.now(),
	pg_catalog.now() OPERATOR(pg_catalog.+) (40000000::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'),
	pg_catalog.now() OPERATOR(pg_catalog.+) (86400000000::bigint OPERATOR(pg_catalog.*) interval '1 microsecond'), false)
ON CONFLICT (principal, key) DO NOTHING;
SELECT principal, key, fingerprint, state, lease_token, request_id, nonce, created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body, pg_catalog.now() FROM "idem_bench"."pgx_keys" WHERE principal OPERATOR(pg_catalog.=) 'acct' AND key OPERATOR(pg_catalog.=) ('pgb-' || :k || '-' || :client_id);
\endpipeline
\startpipeline
begin isolation level read committed read write;
SELECT pg_catalog.set_config('idem.sync_lsn', pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text, true),
	pg_catalog.set_config('idem.lease', '0123456789abcdef0123456789abcdef', true);
INSERT INTO idem_bench.payments_pgx (id, account, amount, currency, description)
VALUES ('pgb-' || :k || '-' || :client_id, 'acct', 1000, 'EUR', 'coffee');
\endpipeline
\startpipeline
SELECT pg_catalog.set_config('lock_timeout', '2000ms', true),
	pg_catalog.set_config('statement_timeout', '4000ms', true),
	pg_catalog.set_config('synchronous_commit',
		CASE WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) 'remote_apply'
			THEN 'remote_apply' ELSE 'on' END, true),
	pg_catalog.set_config('tcp_keepalives_idle', '4', false),
	pg_catalog.set_config('tcp_keepalives_interval', '1', false),
	pg_catalog.set_config('tcp_keepalives_count', '4', false),
	pg_catalog.set_config('tcp_user_timeout', '8000', false),
	CASE WHEN pg_catalog.current_setting('idem.lease', true) OPERATOR(pg_catalog.=) '0123456789abcdef0123456789abcdef'::pg_catalog.text THEN 1
	ELSE ('idempgx transaction ended: idem.lease is '::pg_catalog.text OPERATOR(pg_catalog.||)
		pg_catalog.quote_nullable(pg_catalog.current_setting('idem.lease', true)))::pg_catalog.int4 END;
WITH u AS (
	UPDATE "idem_bench"."pgx_keys" SET state = 'completed', status = 201, uncertain = false,
		headers = '\x01020c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e084c6f636174696f6e011e2f7061796d656e74732f7061795f30313233343536373839616263646566'::bytea,
		body = '\x7b226964223a227061795f30313233343536373839616263646566222c22616d6f756e74223a313030302c2263757272656e6379223a22455552222c226465736372697074696f6e223a22636f66666565222c22737461747573223a22737563636565646564227d'::bytea
	WHERE principal OPERATOR(pg_catalog.=) 'acct' AND key OPERATOR(pg_catalog.=) ('pgb-' || :k || '-' || :client_id) AND lease_token OPERATOR(pg_catalog.=) 'tok' AND state OPERATOR(pg_catalog.=) 'in_progress'
	RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT FROM u) THEN 1
	ELSE ('idempgx lease lost: fenced update matched no row (backend '::pg_catalog.text OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.||) ')')::pg_catalog.int4 END;
COMMIT;
\endpipeline
