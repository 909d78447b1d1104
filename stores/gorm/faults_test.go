package idemgorm_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/idemgo/idem/core/storetest"
	idemgorm "github.com/idemgo/idem/stores/gorm"
)

// TestFaults runs core/storetest.RunFaults on GORM over PostgreSQL: the
// store's connections are cut during the claim, after the business write,
// before the COMMIT reaches the server and after it did (the ambiguous
// case), and every key must end with one effect and its completed record.
func TestFaults(t *testing.T) {
	t.Parallel()
	direct := newFixture(t, "postgres")
	pc, err := pgx.ParseConfig(pgDSN())
	if err != nil {
		t.Fatal(err)
	}
	table := strings.TrimSuffix(direct.Effects, "_effects")
	storetest.RunFaults(t, storetest.FaultTarget{
		Addr: net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)),
		Connect: func(t testing.TB, proxyAddr string) storetest.Backend {
			host, port, _ := net.SplitHostPort(proxyAddr)
			dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", host, port, pc.User, pc.Database)
			// The simple protocol puts the statement text on the wire with
			// every execution, where the proxy can see it.
			db, err := gorm.Open(postgres.New(postgres.Config{DSN: dsn, PreferSimpleProtocol: true}), gormConfig())
			if err != nil {
				t.Fatal(err)
			}
			sqlDB, err := db.DB()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sqlDB.Close() })
			store, err := idemgorm.New(db, idemgorm.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			through := &fixture{DB: db, Store: store, Dialect: "postgres", Effects: direct.Effects}
			b := through.Backend()
			b.CountEffects = direct.CountEffects // counted directly, not through the proxy
			return b
		},
		Claim:  []byte("DO NOTHING RETURNING"),
		Commit: []byte("commit"),
		Effect: []byte("INSERT INTO " + direct.Effects),
	})
}
