-- The hand-written floor's replay (bench.Floor): the claim's INSERT meets
-- the key ('pgb-replay-<client>', inserted by each client's first
-- transaction) and returns nothing, then a SELECT reads the stored row. Two
-- round trips.
INSERT INTO idem_bench.floor_keys (principal, key, fingerprint, state, lease_token, expires_at)
VALUES ('acct', 'pgb-replay-' || :client_id, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, 'in_progress', 'tok', now() + interval '24 hours')
ON CONFLICT (principal, key) DO NOTHING RETURNING lease_token;
SELECT state, fingerprint, status, location, body FROM idem_bench.floor_keys
WHERE principal = 'acct' AND key = 'pgb-replay-' || :client_id;
