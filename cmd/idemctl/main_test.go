package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/idemgo/idem/cmd/idemctl/internal/ctl"
	"github.com/idemgo/idem/cmd/idemctl/internal/open"
)

// The exit code of a command line without a store: 2, a usage error.
func Example() {
	os.Unsetenv("IDEM_DSN")
	code := ctl.Main(context.Background(), []string{"stats"}, nil, io.Discard, os.Stdout, open.Store)
	fmt.Println("exit", code)
	// Output:
	// idemctl: usage: --dsn (or IDEM_DSN) is required
	// idemctl: 'idemctl help' lists the commands and flags
	// exit 2
}
