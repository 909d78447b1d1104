package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// Usage is the command line's help text.
const Usage = `usage: idemctl COMMAND [flags] [PRINCIPAL KEY]

Commands:
  stats                   records by state, stale claims (past their own lease) and how many
                          of them have an unknown outcome, the oldest lease, expired records
  stale                   the in-progress records past their lease, the longest expired first;
                          OUTCOME unknown marks one whose attempt's work may have committed
  show PRINCIPAL KEY      one record: state, whether its lease is live, whether its outcome is
                          unknown, fingerprint, request id, times, stored status and headers
                          (the body with --body)
  release PRINCIPAL KEY   mark an in-progress claim released, fenced by the lease token it
                          read; it deletes nothing: the key is free for the next retry, which
                          runs the handler afresh, and the record keeps its nonce until it
                          expires. Refuses a live lease, and a record whose outcome is unknown,
                          unless --force
  complete PRINCIPAL KEY  store a response (--status, --header, --body-file) as the outcome of
                          a stale or outcome-unknown claim, taken over as the engine takes one
                          over: retries replay it instead of running the handler
  purge                   delete the expired records
  reconcile               one pass over the stale claims, asking --url what became of each

Flags (before or after the arguments):
  --dsn DSN               the store (or $IDEM_DSN): postgres://… or host=… dbname=…
                          (PostgreSQL), mysql://… or user:pass@tcp(host:3306)/db (MySQL,
                          MariaDB), sqlite:PATH, redis://host:6379/0
  --store KIND            postgres, mysql, sqlite or redis, when the DSN's shape does not say
  --table NAME            the SQL store's table (default the store's default)
  --prefix P              the Redis store's key prefix (default idem:)
  --limit N               at most N records for stale and reconcile; stats counts the stale
                          claims up to N (default 100)
  --json                  JSON instead of aligned text
  --body                  show: print the stored body
  --force                 release: release a live lease or a record whose outcome is unknown
                          (says what it risks)
  --yes                   release, complete, purge: do not ask for confirmation (required when
                          stdin is not a terminal)
  --dry-run               release, complete, purge, reconcile: say what would be done, change
                          nothing
  --status N              complete: the response's status (2xx, 3xx stored as completed, 4xx
                          as failed)
  --header 'Name: value'  complete: a response header, repeatable; only --stored-headers' names
  --body-file PATH        complete: the response's body (at most 1 MiB)
  --stored-body plain|omit
                          complete, reconcile (required): plain if the application stores
                          bodies as they are; omit if it seals them (Config.BodySealer, which
                          idemctl cannot do) or sets OmitStoredBody: a replay then has an
                          empty body
  --stored-headers a,b    complete, reconcile: the application's Config.StoredHeaders (default
                          Content-Type,Location,Content-Language,Cache-Control)
  --retention D           complete, reconcile: how long a record taken over is kept from then;
                          your Config.Retention (default 24h)
  --url URL               reconcile: the reconciler to POST each stale claim to
  --ask-timeout D         reconcile: bound each request to the reconciler (default 10s)
  --steps a,b             reconcile: send the downstream keys of these steps
                          (idem.DownstreamKey's step names) with each claim
  --timeout D             bound the whole command (default 1m)

Staleness is each record's own lease deadline on the store's clock: no --lease.

Exit codes: 0 found or done, 1 not found, 2 usage (or stdin not a terminal without --yes),
3 store error, 4 refused (nothing done: a live lease or an unknown outcome without --force,
a lease lost, not confirmed), 5 reconcile: the reconciler gave no valid answer, the claim is kept.
`

// Opened is a store an Opener opened: the store, a description of it for
// the output, and the function that closes its connections.
type Opened struct {
	Store idemstore.Store
	// Name describes the store without credentials: "postgres
	// "public"."idempotency_keys"", "redis 127.0.0.1:6379 prefix idem:".
	Name  string
	Close func()
}

// An Opener opens the store d names; table and prefix are empty for the
// store's default. Main's caller passes the one that knows the stores.
type Opener func(ctx context.Context, d dsn.DSN, table, prefix string) (*Opened, error)

// args is a parsed command line.
type args struct {
	cmd, dsn, store, table, prefix string
	timeout                        time.Duration
	pos                            []string
	o                              Options
	status                         int
	header                         http.Header
	bodyFile                       string
}

// commandArgs is how many positional arguments each command takes.
var commandArgs = map[string]int{"stats": 0, "stale": 0, "show": 2, "release": 2, "complete": 2, "purge": 0, "reconcile": 0}

// flagCommands names the commands a flag is for; the others take every
// command.
var flagCommands = map[string][]string{
	"body":           {"show"},
	"force":          {"release"},
	"yes":            {"release", "complete", "purge"},
	"dry-run":        {"release", "complete", "purge", "reconcile"},
	"status":         {"complete"},
	"header":         {"complete"},
	"body-file":      {"complete"},
	"stored-body":    {"complete", "reconcile"},
	"stored-headers": {"complete", "reconcile"},
	"retention":      {"complete", "reconcile"},
	"url":            {"reconcile"},
	"ask-timeout":    {"reconcile"},
	"steps":          {"reconcile"},
}

// splitList splits a comma-separated flag value, dropping empty names.
func splitList(v string) []string {
	var out []string
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
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
	fs.StringVar(&a.store, "store", "", "")
	fs.StringVar(&a.table, "table", "", "")
	fs.StringVar(&a.prefix, "prefix", "", "")
	fs.Func("lease", "", func(string) error {
		return errors.New("--lease is gone: every record carries its own lease deadline, which stale, show, release and reconcile judge it by")
	})
	fs.IntVar(&a.o.Limit, "limit", 100, "")
	fs.BoolVar(&a.o.JSON, "json", false, "")
	fs.BoolVar(&a.o.Body, "body", false, "")
	fs.BoolVar(&a.o.Force, "force", false, "")
	fs.BoolVar(&a.o.Yes, "yes", false, "")
	fs.BoolVar(&a.o.DryRun, "dry-run", false, "")
	fs.IntVar(&a.status, "status", 0, "")
	fs.Func("header", "", func(v string) error {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return fmt.Errorf("--header %q: want 'Name: value'", v)
		}
		if a.header == nil {
			a.header = http.Header{}
		}
		a.header[name] = append(a.header[name], strings.TrimSpace(value))
		return nil
	})
	fs.StringVar(&a.bodyFile, "body-file", "", "")
	fs.StringVar(&a.o.StoredBody, "stored-body", "", "")
	fs.Func("stored-headers", "", func(v string) error {
		a.o.StoredHeaders = splitList(v)
		if a.o.StoredHeaders == nil {
			a.o.StoredHeaders = []string{}
		}
		return nil
	})
	fs.DurationVar(&a.o.Retention, "retention", 0, "")
	fs.StringVar(&a.o.URL, "url", "", "")
	fs.DurationVar(&a.o.AskTimeout, "ask-timeout", defaultAskTimeout, "")
	fs.Func("steps", "", func(v string) error {
		a.o.Steps = append(a.o.Steps, splitList(v)...)
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
	n, ok := commandArgs[a.cmd]
	switch {
	case !ok:
		return a, fmt.Errorf("%w: unknown command %q", ErrUsage, a.cmd)
	case len(a.pos) != n:
		return a, fmt.Errorf("%w: %s takes %d arguments, got %d (%s)", ErrUsage, a.cmd, n, len(a.pos), strings.Join(a.pos, " "))
	case a.dsn == "":
		return a, fmt.Errorf("%w: --dsn (or IDEM_DSN) is required", ErrUsage)
	case a.o.Limit <= 0 || a.timeout <= 0 || a.o.AskTimeout <= 0 || a.o.Retention < 0:
		return a, fmt.Errorf("%w: --limit, --timeout, --ask-timeout and --retention must be positive", ErrUsage)
	case a.cmd == "complete" && a.status == 0:
		return a, fmt.Errorf("%w: complete needs --status", ErrUsage)
	case a.o.StoredBody == StoredBodyOmit && a.bodyFile != "":
		return a, fmt.Errorf("%w: --stored-body=omit stores no body: drop --body-file", ErrUsage)
	}
	var misplaced error
	fs.Visit(func(f *flag.Flag) {
		if cmds, ok := flagCommands[f.Name]; ok && !slices.Contains(cmds, a.cmd) && misplaced == nil {
			misplaced = fmt.Errorf("%w: --%s is for %s, not %s", ErrUsage, f.Name, strings.Join(cmds, ", "), a.cmd)
		}
	})
	return a, misplaced
}

// readBody reads a --body-file, at most MaxBody bytes.
func readBody(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --body-file: %v", ErrUsage, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%w: --body-file: %v", ErrUsage, err)
	}
	if len(b) > MaxBody {
		return nil, fmt.Errorf("%w: --body-file %s is larger than %d bytes, the engine's default MaxResponseBytes", ErrUsage, path, MaxBody)
	}
	return b, nil
}

// Run runs the command argv names on the store open opens, writing its
// output to stdout, and returns its error, with every password of the DSN
// taken out of its text. confirm asks the operator; nil when stdin is not
// a terminal.
func Run(ctx context.Context, argv []string, stdout io.Writer, confirm func(string) (bool, error), open Opener) error {
	a, err := parse(argv)
	if err != nil {
		return dsn.RedactError(err) // an argument in the message may be a DSN given without --dsn
	}
	d, err := dsn.Parse(a.dsn, dsn.Kind(a.store))
	if err != nil {
		return fmt.Errorf("%w: --dsn: %w", ErrUsage, err)
	}
	return d.Scrub(run(ctx, a, d, stdout, confirm, open))
}

func run(ctx context.Context, a args, d dsn.DSN, stdout io.Writer, confirm func(string) (bool, error), open Opener) error {
	switch {
	case a.prefix != "" && d.Kind != dsn.Redis:
		return fmt.Errorf("%w: --prefix names a Redis store's keys; a SQL store takes --table", ErrUsage)
	case a.table != "" && d.Kind == dsn.Redis:
		return fmt.Errorf("%w: --table names a SQL store's table; a Redis store takes --prefix", ErrUsage)
	}
	// What the command would refuse anyway is refused before connecting.
	if a.cmd == "reconcile" {
		if err := checkURL(a.o.URL); err != nil {
			return err
		}
	}
	if a.cmd == "reconcile" || a.cmd == "complete" {
		if err := a.o.checkPolicy(); err != nil {
			return err
		}
	}
	var resp idem.Response
	if a.cmd == "complete" {
		body, err := readBody(a.bodyFile)
		if err != nil {
			return err
		}
		resp = idem.Response{Status: a.status, Header: a.header, Body: body}
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	st, err := open(ctx, d, a.table, a.prefix)
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
	case "complete":
		return Complete(ctx, stdout, a.o, a.pos[0], a.pos[1], resp)
	case "purge":
		return Purge(ctx, stdout, a.o)
	default:
		return Reconcile(ctx, stdout, a.o)
	}
}

// Main is idemctl: it runs argv (without the program name) on the store
// open opens, writes errors to stderr, asks for confirmation on stdin when
// stdin is a terminal, and returns the exit code.
func Main(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer, open Opener) int {
	if len(argv) > 0 && (argv[0] == "-h" || argv[0] == "--help" || argv[0] == "help") {
		fmt.Fprint(stdout, Usage)
		return ExitOK
	}
	var confirm func(string) (bool, error)
	if f, ok := stdin.(*os.File); ok && isTerminal(f) {
		confirm = PromptConfirm(f, stderr)
	}
	err := Run(ctx, argv, stdout, confirm, open)
	code := ExitCode(err)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		if code == ExitUsage && !errors.Is(err, ErrNotATerminal) {
			fmt.Fprintln(stderr, "idemctl: 'idemctl help' lists the commands and flags")
		}
	}
	return code
}
