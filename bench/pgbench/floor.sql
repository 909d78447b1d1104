-- The hand-written floor's first request (bench.Floor), as PostgreSQL sees
-- it: claim, BEGIN, the payment INSERT, the fenced settle UPDATE, COMMIT,
-- five round trips. Tables from bench.Setup (schema idem_bench).
\set k random(1, 2000000000)
INSERT INTO idem_bench.floor_keys (principal, key, fingerprint, state, lease_token, expires_at)
VALUES ('acct', 'pgb-' || :k || '-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', now() + interval '24 hours')
ON CONFLICT (principal, key) DO NOTHING RETURNING lease_token;
BEGIN;
INSERT INTO idem_bench.payments_floor (id, account, amount, currency, description)
VALUES ('pgb-' || :k || '-' || :client_id, 'acct', 1000, 'EUR', 'coffee');
UPDATE idem_bench.floor_keys SET state = 'completed', status = 201, location = '/payments/pay_0123456789abcdef',
	body = '\x7b226964223a227061795f30313233343536373839616263646566222c22616d6f756e74223a313030302c2263757272656e6379223a22455552222c226465736372697074696f6e223a22636f66666565222c22737461747573223a22737563636565646564227d'::bytea
WHERE principal = 'acct' AND key = 'pgb-' || :k || '-' || :client_id AND lease_token = 'tok' AND state = 'in_progress';
COMMIT;
