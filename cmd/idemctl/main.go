// Command idemctl shows and mends the records of an idem store: counts,
// stale claims, one record, a fenced release, a fenced completion of a
// record whose outcome is unknown, a purge and a reconciling pass. See
// README.md for the commands, the exit codes and the runbook for the
// stale-claim alert.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	"github.com/idemgo/idem/cmd/idemctl/internal/open"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := ctl.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, open.Store)
	stop()
	os.Exit(code)
}
