package open

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
)

// The drivers' own log lines go through the DSN's scrub.
func TestDriverLogsAreScrubbed(t *testing.T) {
	var buf bytes.Buffer
	logOutput = &buf
	t.Cleanup(func() { logOutput = os.Stderr })
	d, err := dsn.Parse("root:s3cr3t-pw@tcp(127.0.0.1:3306)/test", "")
	if err != nil {
		t.Fatal(err)
	}
	opened.Lock()
	opened.dsns = append(opened.dsns, d)
	opened.Unlock()
	var l driverLog
	l.Print("packets.go:58 unexpected EOF on root:s3cr3t-pw@tcp(127.0.0.1:3306)/test")
	l.Printf(context.Background(), "redis: auth with %q failed\n", "s3cr3t-pw")
	out := buf.String()
	if strings.Contains(out, "s3cr3t") || strings.Count(out, "\n") != 2 || !strings.HasPrefix(out, "idemctl: mysql: packets.go:58") {
		t.Errorf("the driver log:\n%s", out)
	}
}
