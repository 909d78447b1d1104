package idemgorm_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoPostgresDriverLinked: a GORM program on idemgorm with only the
// MySQL or only the SQLite dialector links no PostgreSQL driver. A
// program's packages are the union of its imports' dependencies, so the
// dependencies of idemgorm and the one dialector are those of such a main.
func TestNoPostgresDriverLinked(t *testing.T) {
	for name, dialector := range map[string]string{
		"mysql":  "gorm.io/driver/mysql",
		"sqlite": "github.com/glebarez/sqlite",
	} {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "github.com/idemgo/idem/stores/gorm", dialector).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			deps := "\n" + string(out)
			if !strings.Contains(deps, "\n"+dialector+"\n") {
				t.Fatalf("go list -deps does not list %s itself:\n%s", dialector, out)
			}
			for _, pg := range []string{"\ngithub.com/jackc/", "\ngithub.com/lib/pq", "\ngorm.io/driver/postgres"} {
				if strings.Contains(deps, pg) {
					t.Errorf("a %s-only GORM program on idemgorm links %s", name, strings.TrimSpace(pg))
				}
			}
		})
	}
}
