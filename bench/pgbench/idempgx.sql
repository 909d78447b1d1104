-- idempgx's first request as PostgreSQL sees it (the statements of
-- stores/pgx/store.go newStatements and tx.go; keep them in step): the
-- claim, then BEGIN pipelined with the payment INSERT, then the fenced
-- settle and COMMIT pipelined: three round trips. Table from the pgx
-- store's Migrate (idem_bench.pgx_keys).
\set k random(1, 2000000000)
WITH durability AS (
	SELECT set_config('synchronous_commit', 'off', true)
), ins AS (
	INSERT INTO idem_bench.pgx_keys AS t (principal, key, fingerprint, state, lease_token, request_id,
		created_at, locked_at, expires_at)
	VALUES ('acct', 'pgb-' || :k || '-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', 'req', now(), now(), now() + 86400000000::bigint * interval '1 microsecond')
	ON CONFLICT (principal, key) DO NOTHING
	RETURNING principal, key, fingerprint, state, lease_token, request_id, created_at, locked_at, expires_at, status, headers, body
)
SELECT true, principal, key, fingerprint, state, lease_token, request_id, created_at, locked_at, expires_at, status, headers, body, now() FROM ins, durability
UNION ALL
SELECT false, principal, key, fingerprint, state, lease_token, request_id, created_at, locked_at, expires_at, status, headers, body, now() FROM idem_bench.pgx_keys, durability
WHERE principal = 'acct' AND key = 'pgb-' || :k || '-' || :client_id AND NOT EXISTS (SELECT 1 FROM ins);
\startpipeline
begin isolation level read committed;
INSERT INTO idem_bench.payments_pgx (id, account, amount, currency, description)
VALUES ('pgb-' || :k || '-' || :client_id, 'acct', 1000, 'EUR', 'coffee');
\endpipeline
\startpipeline
WITH u AS (
	UPDATE idem_bench.pgx_keys SET state = 'completed', status = 201,
		headers = '{"Content-Type":["application/json"],"Location":["/payments/pay_0123456789abcdef"]}',
		body = '\x7b226964223a227061795f30313233343536373839616263646566222c22616d6f756e74223a313030302c2263757272656e6379223a22455552222c226465736372697074696f6e223a22636f66666565222c22737461747573223a22737563636565646564227d'::bytea
	WHERE principal = 'acct' AND key = 'pgb-' || :k || '-' || :client_id AND lease_token = 'tok' AND state = 'in_progress'
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('idempgx lease lost: fenced update matched ' || count(*) || ' rows')::int END FROM u;
COMMIT;
\endpipeline
