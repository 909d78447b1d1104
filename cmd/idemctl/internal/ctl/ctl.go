// Package ctl is idemctl: the commands an operator runs against an idem
// store, each a function that writes to an io.Writer, and Main, which
// parses the command line, opens the store and maps the outcome to an exit
// code. The commands use only the idem.Store methods, so they work the same
// on every store.
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
)

// Exit codes of Main.
const (
	ExitOK       = 0 // found, or done
	ExitNotFound = 1 // no record for the principal and key
	ExitUsage    = 2 // the command line is wrong
	ExitStore    = 3 // the store failed or is misconfigured
	ExitRefused  = 4 // refused, nothing done: a live lease without --force, a lease lost, no confirmation
)

// Errors the commands return; ExitCode maps them to exit codes.
var (
	// ErrUsage marks a wrong command line.
	ErrUsage = errors.New("usage")
	// ErrRefused marks a command that refused to act and changed nothing.
	ErrRefused = errors.New("refused")
)

// ExitCode returns the exit code for a command's error: ExitOK for nil,
// ExitNotFound for idem.ErrNotFound, ExitUsage for ErrUsage, ExitRefused
// for ErrRefused, and ExitStore for everything else.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, ErrRefused):
		return ExitRefused
	case errors.Is(err, idem.ErrNotFound):
		return ExitNotFound
	}
	return ExitStore
}

// Options are what every command reads. Store is required; the zero
// value of every other field is its default.
type Options struct {
	// Store is the store the command works on.
	Store idem.Store
	// Name describes the store in the output (Opened.Name).
	Name string
	// Lease is the engine's lease: an in-progress record locked longer
	// ago is stale. Default DefaultLease.
	Lease time.Duration
	// Limit bounds the records stale and reconcile handle. Default 100.
	Limit int
	// JSON writes JSON instead of aligned text.
	JSON bool
	// Body makes show print the stored body.
	Body bool
	// Force lets release delete a live lease.
	Force bool
	// Yes answers the confirmation of release and purge.
	Yes bool
	// DryRun makes release, purge and reconcile say what they would do
	// and change nothing.
	DryRun bool
	// Confirm asks the operator a yes/no question; nil means there is no
	// terminal to ask, so release and purge need Yes.
	Confirm func(question string) (bool, error)
	// URL is the reconciler reconcile asks (see Reconcile).
	URL string
	// HTTPClient calls URL. Default a client with a 10 s timeout.
	HTTPClient *http.Client
	// Retention is how long reconcile keeps an outcome it stores. Default
	// idem.DefaultRetention.
	Retention time.Duration
	// Steps are the step names whose downstream keys reconcile sends the
	// reconciler with each claim (ReconcileRequest.DownstreamKeys).
	Steps []string
	// Now is this machine's clock, which show, stale and release measure
	// lease ages with (Get returns no store clock). Default time.Now.
	Now func() time.Time
}

// DefaultLease is the lease of an engine with the default Config:
// RequestTimeout + StoreTimeout + 5 s.
const DefaultLease = idem.DefaultRequestTimeout + idem.DefaultStoreTimeout + 5*time.Second

func (o *Options) defaults() {
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if o.Retention <= 0 {
		o.Retention = idem.DefaultRetention
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// confirm asks question unless o.Yes; with no terminal and no Yes it
// refuses with ErrUsage.
func (o *Options) confirm(question string) error {
	if o.Yes {
		return nil
	}
	if o.Confirm == nil {
		return fmt.Errorf("%w: not on a terminal: pass --yes to confirm, or --dry-run to see what would be done", ErrUsage)
	}
	ok, err := o.Confirm(question)
	if err != nil {
		return fmt.Errorf("confirm: %w", err)
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
