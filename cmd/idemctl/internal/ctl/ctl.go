// Package ctl is idemctl: the commands an operator runs against an idem
// store, each a function that writes to an io.Writer, and Main, which
// parses the command line, opens the store and maps the outcome to an exit
// code. The commands use only the idemstore.Store methods, so they work the same
// on every store; this package opens none itself (Main is given an Opener),
// so it is tested on core/memstore.
package ctl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// Exit codes of Main.
const (
	ExitOK       = 0 // found, or done
	ExitNotFound = 1 // no record for the principal and key
	ExitUsage    = 2 // the command line is wrong, or stdin is not a terminal and --yes is missing
	ExitStore    = 3 // the store failed or is misconfigured
	ExitRefused  = 4 // refused, nothing done: a live lease or an unknown outcome without --force, a lease lost, no confirmation
	ExitKept     = 5 // reconcile: the reconciler gave no valid answer for a claim, which is kept
)

// Errors the commands return; ExitCode maps them to exit codes.
var (
	// ErrUsage marks a wrong command line.
	ErrUsage = errors.New("usage")
	// ErrRefused marks a command that refused to act and changed nothing.
	ErrRefused = errors.New("refused")
	// ErrReconciler marks a reconciler that gave no valid answer (an HTTP
	// error, a redirect, a 404, a malformed body, no answer in time): the
	// claim it was asked about is kept (Store.Keep) and the pass stops.
	ErrReconciler = errors.New("reconciler")
)

// ExitCode returns the exit code for a command's error: ExitOK for nil,
// ExitUsage for ErrUsage, ExitRefused for ErrRefused, ExitKept for
// ErrReconciler, ExitNotFound for idemstore.ErrNotFound, and ExitStore for
// everything else.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, ErrRefused):
		return ExitRefused
	case errors.Is(err, ErrReconciler):
		return ExitKept
	case errors.Is(err, idemstore.ErrNotFound):
		return ExitNotFound
	}
	return ExitStore
}

// What complete and reconcile store of a response's body
// (Options.StoredBody).
const (
	// StoredBodyPlain stores the body as it is: for an application
	// without Config.BodySealer.
	StoredBodyPlain = "plain"
	// StoredBodyOmit stores no body, as Config.OmitStoredBody does: for an
	// application with OmitStoredBody, or with a BodySealer, whose sealed
	// bodies idemctl cannot make (a replay then sends the stored status
	// and headers with an empty body, which a sealer never has to open).
	StoredBodyOmit = "omit"
)

// MaxBody bounds the body complete and reconcile store: the engine's
// default Config.MaxResponseBytes.
const MaxBody = idem.DefaultMaxResponseBytes

// Options are what every command reads. Store is required; the zero
// value of every other field is its default.
type Options struct {
	// Store is the store the command works on.
	Store idemstore.Store
	// Name describes the store in the output (Opened.Name).
	Name string
	// Limit bounds the records stale and reconcile handle, and the stale
	// claims stats counts. Default 100.
	Limit int
	// JSON writes JSON instead of aligned text.
	JSON bool
	// Body makes show print the stored body.
	Body bool
	// Force lets release release a live lease or a record whose outcome is
	// unknown.
	Force bool
	// Yes answers the confirmation of release, complete and purge.
	Yes bool
	// DryRun makes release, complete, purge and reconcile say what they
	// would do and change nothing.
	DryRun bool
	// Confirm asks the operator a yes/no question; nil means stdin is not
	// a terminal, so release, complete and purge need Yes.
	Confirm func(question string) (bool, error)
	// URL is the reconciler reconcile asks (see Reconcile).
	URL string
	// HTTPClient calls URL. Default http.DefaultClient's transport. Reconcile
	// never follows a redirect, whatever the client's CheckRedirect.
	HTTPClient *http.Client
	// AskTimeout bounds each request to the reconciler, its answer's body
	// included. Default 10 s.
	AskTimeout time.Duration
	// Retention is how long a record that reconcile or complete takes over
	// is kept from then (ClaimRequest.Retention): set it to the
	// application's Config.Retention. Default idem.DefaultRetention.
	Retention time.Duration
	// Steps are the step names whose downstream keys reconcile sends the
	// reconciler with each claim (ReconcileRequest.DownstreamKeys).
	Steps []string
	// StoredHeaders is the application's Config.StoredHeaders: the response
	// headers complete and reconcile store. Default
	// idem.DefaultStoredHeaders.
	StoredHeaders []string
	// StoredBody is what complete and reconcile store of a body:
	// StoredBodyPlain or StoredBodyOmit. It has no default: idemctl cannot
	// tell whether the application seals its bodies, and a plain body
	// stored for one that does is answered 500 replay-unreadable.
	StoredBody string
}

// defaultAskTimeout is Options.AskTimeout's default.
const defaultAskTimeout = 10 * time.Second

// statsStaleAfter is the threshold idemctl passes to Store.Stats, whose
// Stale count it does not show: stale claims are counted by their own
// lease (ListStale).
const statsStaleAfter = idem.DefaultRequestTimeout + idem.DefaultStoreTimeout + 5*time.Second

func (o *Options) defaults() {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{}
	}
	if o.AskTimeout <= 0 {
		o.AskTimeout = defaultAskTimeout
	}
	if o.Retention <= 0 {
		o.Retention = idem.DefaultRetention
	}
	if o.StoredHeaders == nil {
		o.StoredHeaders = idem.DefaultStoredHeaders
	}
}

// ErrNotATerminal is the reason a confirmation cannot be asked: stdin is
// not a terminal (a pipe, a file, /dev/null). It wraps ErrUsage.
var ErrNotATerminal = fmt.Errorf("%w: stdin is not a terminal: pass --yes to confirm, or --dry-run to see what would be done", ErrUsage)

// confirm asks question unless o.Yes; with no terminal and no Yes it
// returns ErrNotATerminal. No answer (end of input) is a refusal.
func (o *Options) confirm(question string) error {
	if o.Yes {
		return nil
	}
	if o.Confirm == nil {
		return ErrNotATerminal
	}
	ok, err := o.Confirm(question)
	if err != nil {
		return fmt.Errorf("%w: no answer (%v); nothing done", ErrRefused, err)
	}
	if !ok {
		return fmt.Errorf("%w: not confirmed; nothing done", ErrRefused)
	}
	return nil
}

// PromptConfirm returns a Confirm that writes question and " [y/N] " to
// out and reads the answer from in: "y" or "yes" confirms.
func PromptConfirm(in io.Reader, out io.Writer) func(string) (bool, error) {
	r := bufio.NewReader(in)
	return func(question string) (bool, error) {
		fmt.Fprintf(out, "%s [y/N] ", question)
		line, err := r.ReadString('\n')
		if err != nil && line == "" {
			return false, err
		}
		a := strings.ToLower(strings.TrimSpace(line))
		return a == "y" || a == "yes", nil
	}
}
