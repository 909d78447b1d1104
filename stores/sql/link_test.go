package idemsql_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoPostgresDriverLinked: a program on idemsql with only a MySQL or
// only a SQLite driver links no PostgreSQL driver. A program's packages
// are the union of its imports' dependencies, so the dependencies of
// idemsql and the one driver are those of such a main.
func TestNoPostgresDriverLinked(t *testing.T) {
	for name, driver := range map[string]string{
		"mysql":  "github.com/go-sql-driver/mysql",
		"sqlite": "github.com/glebarez/go-sqlite",
	} {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "github.com/idemgo/idem/stores/sql", driver).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			deps := strings.Fields(string(out))
			if !containsDep(deps, driver) {
				t.Fatalf("go list -deps does not list the driver %s itself:\n%s", driver, out)
			}
			for _, pg := range []string{"github.com/jackc/", "github.com/lib/pq"} {
				if containsDep(deps, pg) {
					t.Errorf("a %s-only program on idemsql links %s", name, pg)
				}
			}
		})
	}
}

func containsDep(deps []string, prefix string) bool {
	for _, d := range deps {
		if strings.HasPrefix(d, prefix) {
			return true
		}
	}
	return false
}
