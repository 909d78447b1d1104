package pgsqltest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/idemgo/idem/stores/internal/pgsql/pgsqltest"
)

// TestQuietServer: the server answers on its DSN, in database test, and
// no one but the test is connected to it.
func TestQuietServer(t *testing.T) {
	dsn := pgsqltest.QuietServer(t)
	out, err := exec.Command("psql", "-XAtq", dsn, "-c",
		"SELECT current_database(), count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").CombinedOutput()
	if err != nil {
		t.Fatalf("psql %s: %v\n%s", dsn, err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "test|1" {
		t.Fatalf("database and client sessions = %q, want test|1", got)
	}
}
