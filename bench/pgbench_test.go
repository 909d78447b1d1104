package bench

import (
	"bytes"
	"os/exec"
	"testing"
)

// TestPgbenchScripts runs each of bench/pgbench's scripts once against the
// tables the stores' Migrate creates, so that a schema change the scripts
// were not kept in step with fails here instead of in the next
// measurement. It replaces the benchmark tables.
func TestPgbenchScripts(t *testing.T) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		t.Fatalf("pgbench is not installed (it comes with the PostgreSQL server package scripts/services.sh installs): %v", err)
	}
	ctx, _ := setupTest(t)
	for _, v := range postgresVariants() {
		_, closeFn, err := v.Open(ctx, 1, &Counter{})
		if err != nil {
			t.Fatalf("%s: %v", v.Label, err)
		}
		closeFn()
	}
	for _, script := range []string{"pgbench/floor.sql", "pgbench/idempgx.sql", "pgbench/floor-replay.sql", "pgbench/idempgx-replay.sql"} {
		out, err := exec.CommandContext(ctx, pgbench, "-n", "-M", "prepared", "-t", "2", "-c", "1", "-f", script, DSN()).CombinedOutput()
		if err != nil || bytes.Contains(out, []byte("error")) || !bytes.Contains(out, []byte("number of transactions actually processed: 2/2")) {
			t.Errorf("pgbench -f %s: %v\n%s", script, err, out)
		}
	}
}
