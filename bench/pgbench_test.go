package bench

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestPgbenchScripts runs each of bench/pgbench's scripts once against the
// tables the stores' Migrate creates, so that a schema change the scripts
// were not kept in step with fails here instead of in the next
// measurement. It replaces the benchmark tables. pgbench scripts cannot
// include one another, so idempgx-replay.sql repeats idempgx.sql's claim
// batch; the test holds the two the same but for the key.
func TestPgbenchScripts(t *testing.T) {
	first, replay := claimBatch(t, "pgbench/idempgx.sql"), claimBatch(t, "pgbench/idempgx-replay.sql")
	if strings.ReplaceAll(first, "'pgb-' || :k || '-' || :client_id", "'pgb-replay-' || :client_id") != replay {
		t.Errorf("idempgx-replay.sql's claim batch is not idempgx.sql's with the replay key:\n%s\nwant\n%s", replay, first)
	}
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

// claimBatch returns the first pipelined batch of a pgbench script: the
// claim behind its prelude.
func claimBatch(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok1 := strings.Cut(string(b), "\\startpipeline\n")
	batch, _, ok2 := strings.Cut(rest, "\\endpipeline\n")
	if !ok1 || !ok2 {
		t.Fatalf("%s has no pipelined batch", path)
	}
	return batch
}
