package pgsql_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/stores/internal/pgsql"
)

// A store validates its table name, qualifies it, and builds its
// statements once; the claim is the prelude, the INSERT and the SELECT,
// pipelined as one round trip.
func Example() {
	t, err := pgsql.ParseTable("billing.idempotency_keys")
	if err != nil {
		panic(err)
	}
	s := pgsql.New(t, pgsql.Options{LockTimeout: 2 * time.Second, StatementTimeout: 4 * time.Second})
	fmt.Println(t.Ident())
	fmt.Println(strings.SplitN(s.Claim, "\n", 2)[0])
	fmt.Println(s.ClaimRead)
	// Output:
	// "billing"."idempotency_keys"
	// INSERT INTO "billing"."idempotency_keys" (principal, key, fingerprint, state, lease_token, request_id, nonce,
	// SELECT principal, key, fingerprint, state, lease_token, request_id, nonce,
	// 	created_at, locked_at, lease_expires_at, expires_at, uncertain, status, headers, body, pg_catalog.now() FROM "billing"."idempotency_keys" WHERE principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2
}
