package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Usage is the command line's help text.
const Usage = `usage: idemctl COMMAND [flags] [PRINCIPAL KEY]

Commands:
  stats                  records by state, stale claims, the oldest lease, expired records
  stale                  the in-progress records whose lease expired, oldest first
  show PRINCIPAL KEY     one record: state, fingerprint, request id, times, stored status
                         and headers (the body with --body)
  release PRINCIPAL KEY  delete an in-progress claim, fenced by the lease token it read;
                         refuses a live lease unless --force
  purge                  delete the expired records
  reconcile              one pass over the stale claims, asking --url what became of each

Flags (before or after the arguments):
  --dsn DSN        the store (or $IDEM_DSN): postgres://…, mysql://user@host:3306/db,
                   sqlite:PATH, redis://host:6379/0
  --table NAME     the SQL store's table (default the store's default)
  --prefix P       the Redis store's key prefix (default idem:)
  --lease D        the engine's lease: older in-progress records are stale (default 40s)
  --limit N        at most N records for stale and reconcile (default 100)
  --json           JSON instead of aligned text
  --body           show: print the stored body
  --force          release: release a live lease (says what it risks)
  --yes            release, purge: do not ask for confirmation
  --dry-run        release, purge, reconcile: say what would be done, change nothing
  --url URL        reconcile: the reconciler to POST each stale claim to
  --retention D    reconcile: how long a stored outcome is kept (default 24h)
  --steps a,b      reconcile: send the downstream keys of these steps
                   (idem.DownstreamKey's step names) with each claim
  --timeout D      bound the whole command (default 1m)

Exit codes: 0 found or done, 1 not found, 2 usage, 3 store error,
4 refused (nothing done: a live lease without --force, a lease lost, not confirmed).
`

// args is a parsed command line.
type args struct {
	cmd, dsn, table, prefix string
	timeout                 time.Duration
	pos                     []string
	o                       Options
}

// parse reads the command and its flags; flags may come before or after
// the positional arguments.
func parse(argv []string) (args, error) {
	var a args
	if len(argv) == 0 {
		return a, fmt.Errorf("%w: no command", ErrUsage)
	}
	a.cmd = argv[0]
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.dsn, "dsn", os.Getenv("IDEM_DSN"), "")
	fs.StringVar(&a.table, "table", "", "")
	fs.StringVar(&a.prefix, "prefix", "", "")
	fs.DurationVar(&a.o.Lease, "lease", DefaultLease, "")
	fs.IntVar(&a.o.Limit, "limit", 100, "")
	fs.BoolVar(&a.o.JSON, "json", false, "")
	fs.BoolVar(&a.o.Body, "body", false, "")
	fs.BoolVar(&a.o.Force, "force", false, "")
	fs.BoolVar(&a.o.Yes, "yes", false, "")
	fs.BoolVar(&a.o.DryRun, "dry-run", false, "")
	fs.StringVar(&a.o.URL, "url", "", "")
	fs.DurationVar(&a.o.Retention, "retention", 0, "")
	fs.Func("steps", "", func(v string) error {
		for s := range strings.SplitSeq(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				a.o.Steps = append(a.o.Steps, s)
			}
		}
		return nil
	})
	fs.DurationVar(&a.timeout, "timeout", time.Minute, "")
	rest := argv[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return a, fmt.Errorf("%w: %v", ErrUsage, err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		a.pos = append(a.pos, rest[0])
		rest = rest[1:]
	}
	want := map[string]int{"stats": 0, "stale": 0, "show": 2, "release": 2, "purge": 0, "reconcile": 0}
	n, ok := want[a.cmd]
	switch {
	case !ok:
		return a, fmt.Errorf("%w: unknown command %q", ErrUsage, a.cmd)
	case len(a.pos) != n:
		return a, fmt.Errorf("%w: %s takes %d arguments, got %d (%s)", ErrUsage, a.cmd, n, len(a.pos), strings.Join(a.pos, " "))
	case a.dsn == "":
		return a, fmt.Errorf("%w: --dsn (or IDEM_DSN) is required", ErrUsage)
	case a.o.Lease <= 0 || a.o.Limit <= 0 || a.timeout <= 0 || a.o.Retention < 0:
		return a, fmt.Errorf("%w: --lease, --limit and --timeout must be positive", ErrUsage)
	case a.o.Force && a.cmd != "release", a.o.Body && a.cmd != "show":
		return a, fmt.Errorf("%w: --force is for release, --body for show", ErrUsage)
	}
	return a, nil
}

// Run runs the command argv names on the store opened by open, writing its
// output to stdout, and returns its error. confirm asks the operator; nil
// when there is no terminal.
func Run(ctx context.Context, argv []string, stdout io.Writer, confirm func(string) (bool, error),
	open func(ctx context.Context, dsn, table, prefix string) (*Opened, error)) error {
	a, err := parse(argv)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	st, err := open(ctx, a.dsn, a.table, a.prefix)
	if err != nil {
		return err
	}
	defer st.Close()
	a.o.Store, a.o.Name, a.o.Confirm = st.Store, st.Name, confirm
	switch a.cmd {
	case "stats":
		return Stats(ctx, stdout, a.o)
	case "stale":
		return Stale(ctx, stdout, a.o)
	case "show":
		return Show(ctx, stdout, a.o, a.pos[0], a.pos[1])
	case "release":
		return Release(ctx, stdout, a.o, a.pos[0], a.pos[1])
	case "purge":
		return Purge(ctx, stdout, a.o)
	default:
		return Reconcile(ctx, stdout, a.o)
	}
}

// Main is idemctl: it runs argv (without the program name), writes
// errors to stderr, asks for confirmation on stdin when stdin is a
// terminal, and returns the exit code.
func Main(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(argv) > 0 && (argv[0] == "-h" || argv[0] == "--help" || argv[0] == "help") {
		fmt.Fprint(stdout, Usage)
		return ExitOK
	}
	var confirm func(string) (bool, error)
	if f, ok := stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			confirm = PromptConfirm(stdin, stderr)
		}
	}
	err := Run(ctx, argv, stdout, confirm, Open)
	code := ExitCode(err)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		if code == ExitUsage {
			fmt.Fprintln(stderr, "idemctl: 'idemctl help' lists the commands and flags")
		}
	}
	return code
}
