package idemsql_test

import (
	"database/sql"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/core/storetest"
	idemsql "github.com/idemgo/idem/stores/sql"
	"github.com/idemgo/idem/stores/sql/idemsqltest"
)

// TestFaults runs core/storetest.RunFaults on PostgreSQL through pgx's
// stdlib and lib/pq: the store's connections are cut during the claim,
// after the business write, before the COMMIT reaches the server and after
// it did (the ambiguous case), and every key must end with one effect and
// its completed record.
func TestFaults(t *testing.T) {
	pc, err := pgx.ParseConfig(idemsqltest.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	for setup, driver := range map[string]string{"pgx": "pgx", "pq": "postgres"} {
		t.Run(setup, func(t *testing.T) {
			t.Parallel()
			direct := idemsqltest.NewFixture(t, setup)
			storetest.RunFaults(t, storetest.FaultTarget{
				Addr: net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)),
				Connect: func(t testing.TB, proxyAddr string) storetest.Backend {
					host, port, _ := net.SplitHostPort(proxyAddr)
					// The simple protocol puts the statement text on the
					// wire with every execution, where the proxy can see
					// it (lib/pq sends it with every execution anyway).
					dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pc.User, pc.Database)
					if driver == "pgx" {
						dsn += " default_query_exec_mode=simple_protocol"
					}
					db, err := sql.Open(driver, dsn)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = db.Close() })
					// direct's tables, through the proxy; the effects are
					// counted directly.
					store, err := idemsql.New(db, idemsql.WithTable(direct.Store.Table()))
					if err != nil {
						t.Fatal(err)
					}
					through := idemsqltest.Fixture{DB: db, Store: store, Setup: setup, Effects: direct.Effects}
					return through.Backend()
				},
				Claim:  []byte("ON CONFLICT (principal, key) DO NOTHING"),
				Commit: []byte("COMMIT"),
				Effect: []byte("INSERT INTO " + direct.Effects.Table),
			})
		})
	}
}
