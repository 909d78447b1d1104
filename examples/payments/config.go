package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/memstore"
)

// config is the service's configuration: flags, with IDEM_* environment
// variables as their defaults.
type config struct {
	addr             string
	grpcAddr         string
	framework        string
	store            string
	dsn              string
	paymentsDB       string
	requestTimeout   time.Duration
	lease            time.Duration
	storeTimeout     time.Duration
	handlerDelay     time.Duration
	simulateFailures bool
	// durableClaims is idem.Config.DurableClaims: every claim waits for
	// its WAL flush before the handler runs.
	durableClaims bool
	// waitInFlight is idem.Config.WaitInFlight: a duplicate of a request
	// in flight waits this long for its answer instead of a 409.
	waitInFlight time.Duration
	providerURL  string
	providerOnly bool
	// fingerprintKey is idem.Config.FingerprintKey: the flag's bytes as
	// given (a 64-digit hex string is 64 bytes of key, 256 bits of secret).
	fingerprintKey string
	// fingerprintKeyFile holds the key when fingerprintKey is empty; it is
	// created with a random key on first use (keyFileCreated), so that
	// `go run ./examples/payments` works and keeps its key across restarts.
	fingerprintKeyFile string
	keyFileCreated     bool
}

// Default DSNs per store when -dsn is empty.
const (
	defaultSQLitePath = "idem-payments.db"
	// defaultKeyFile is where the fingerprint key is kept when none is
	// given, next to the default SQLite database.
	defaultKeyFile     = "idem-fingerprint.key"
	defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test"
	defaultRedisURL    = "redis://127.0.0.1:6379/0"
	// defaultRedisPaymentsPath is where -store redis keeps the payments
	// when -payments-db is empty: an SQLite file next to the sqlite
	// store's default one.
	defaultRedisPaymentsPath = "idem-payments-redis.db"
)

var (
	frameworkNames = []string{"gin", "echo", "fiber", "nethttp"}
	storeNames     = []string{"sqlite", "gorm-postgres", "gorm-mysql", "pgx", "redis", "memory"}
)

// errHelp is returned by parseConfig for -h: usage was printed, exit 0.
var errHelp = flag.ErrHelp

// parseConfig reads the configuration from args, using getenv for the
// IDEM_* defaults. Usage goes to usageOut for -h. Every error is one line.
func parseConfig(args []string, getenv func(string) string, usageOut io.Writer) (config, error) {
	c := config{addr: "127.0.0.1:8080", framework: "gin", store: "sqlite"}
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(io.Discard)

	var envErr error
	str := func(p *string, name, env, usage string) {
		if v := getenv(env); v != "" {
			*p = v
		}
		fs.StringVar(p, name, *p, usage+" (env "+env+")")
	}
	dur := func(p *time.Duration, name, env, usage string) {
		if v := getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil && envErr == nil {
				envErr = fmt.Errorf("invalid value %q for %s: want a duration such as 500ms or 2s", v, env)
			}
			*p = d
		}
		fs.DurationVar(p, name, *p, usage+" (env "+env+")")
	}
	boolean := func(p *bool, name, env, usage string) {
		if v := getenv(env); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil && envErr == nil {
				envErr = fmt.Errorf("invalid value %q for %s: want true or false", v, env)
			}
			*p = b
		}
		fs.BoolVar(p, name, *p, usage+" (env "+env+")")
	}
	str(&c.addr, "addr", "IDEM_ADDR", "listen address; port 0 picks a free port, logged at start-up")
	str(&c.grpcAddr, "grpc-addr", "IDEM_GRPC_ADDR", "also serve the gRPC API (payments.v1.Payments) on this address; off when empty")
	str(&c.framework, "framework", "IDEM_FRAMEWORK", "web framework: "+strings.Join(frameworkNames, "|"))
	str(&c.store, "store", "IDEM_STORE", "store: "+strings.Join(storeNames, "|"))
	str(&c.dsn, "dsn", "IDEM_DSN", "database: a file path for sqlite (default ./"+defaultSQLitePath+
		"), a URL or DSN for the others (default the local test database; "+defaultRedisURL+" for redis); ignored for memory")
	str(&c.paymentsDB, "payments-db", "IDEM_PAYMENTS_DB", "redis only: the SQL database of the payments, an SQLite file path "+
		"(default ./"+defaultRedisPaymentsPath+") or a postgres:// URL")
	str(&c.fingerprintKey, "fingerprint-key", "IDEM_FINGERPRINT_KEY", "secret the request fingerprints are keyed with: "+
		"at least 32 bytes, the same on every instance and across restarts; in production pass it from a secret store "+
		"(empty: -fingerprint-key-file)")
	c.fingerprintKeyFile = defaultKeyFile
	str(&c.fingerprintKeyFile, "fingerprint-key-file", "IDEM_FINGERPRINT_KEY_FILE", "without -fingerprint-key, the file "+
		"holding it, created with a random key (mode 0600) when missing: for one machine, not for several instances")
	dur(&c.requestTimeout, "request-timeout", "IDEM_REQUEST_TIMEOUT", "handler deadline (0: the library default, 30s)")
	dur(&c.lease, "lease", "IDEM_LEASE", "claim lease; must exceed request-timeout + store-timeout (0: derived)")
	dur(&c.storeTimeout, "store-timeout", "IDEM_STORE_TIMEOUT", "bound on each store call after the handler (0: the library default, 5s)")
	dur(&c.handlerDelay, "handler-delay", "IDEM_HANDLER_DELAY", "sleep inside POST /payments after the payment row is written")
	boolean(&c.simulateFailures, "simulate-failures", "IDEM_SIMULATE_FAILURES",
		"honour the X-Simulate-Failure: transient|panic header on POST /payments")
	dur(&c.waitInFlight, "wait-in-flight", "IDEM_WAIT_IN_FLIGHT", "a duplicate of a request in flight waits up to this long "+
		"for its answer (the replay) instead of 409 at once; it holds no database connection meanwhile (idem.Config.WaitInFlight; 0: off)")
	boolean(&c.durableClaims, "durable-claims", "IDEM_DURABLE_CLAIMS",
		"make every claim durable before the handler runs (idem.Config.DurableClaims)")

	str(&c.providerURL, "provider-url", "IDEM_PROVIDER_URL", "charge every payment through the payment provider at this http:// URL "+
		"(a payments -provider-only process); off when empty")
	fs.BoolVar(&c.providerOnly, "provider-only", false, "serve only the fake payment provider, on -addr")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(usageOut, "Usage: payments [flags]\n\nThe idem example payments service.\n\nFlags:")
			fs.SetOutput(usageOut)
			fs.PrintDefaults()
			return c, errHelp
		}
		return c, err
	}
	if envErr != nil {
		return c, envErr
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if !slices.Contains(frameworkNames, c.framework) {
		return fmt.Errorf("invalid -framework %q: want one of %s", c.framework, strings.Join(frameworkNames, ", "))
	}
	if !slices.Contains(storeNames, c.store) {
		return fmt.Errorf("invalid -store %q: want one of %s", c.store, strings.Join(storeNames, ", "))
	}
	if _, _, err := net.SplitHostPort(c.addr); err != nil {
		return fmt.Errorf("invalid -addr %q: %v", c.addr, err)
	}
	if c.providerURL != "" {
		if u, err := url.Parse(c.providerURL); err != nil || u.Scheme != "http" || u.Host == "" {
			return fmt.Errorf("invalid -provider-url %q: want http://host:port", c.providerURL)
		}
	}
	if c.grpcAddr != "" {
		if _, _, err := net.SplitHostPort(c.grpcAddr); err != nil {
			return fmt.Errorf("invalid -grpc-addr %q: %v", c.grpcAddr, err)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"request-timeout", c.requestTimeout}, {"lease", c.lease}, {"store-timeout", c.storeTimeout}, {"handler-delay", c.handlerDelay}, {"wait-in-flight", c.waitInFlight}} {
		if d.v < 0 {
			return fmt.Errorf("invalid -%s %v: must not be negative", d.name, d.v)
		}
	}
	if c.providerOnly {
		return nil // the provider keys nothing
	}
	if c.fingerprintKey == "" {
		if err := c.loadKeyFile(); err != nil {
			return err
		}
	}
	if len(c.fingerprintKey) < idem.MinFingerprintKeyBytes {
		return fmt.Errorf("invalid (%d bytes) -fingerprint-key (env IDEM_FINGERPRINT_KEY): the secret the request fingerprints "+
			"are keyed with, at least %d bytes, the same on every instance and across restarts",
			len(c.fingerprintKey), idem.MinFingerprintKeyBytes)
	}
	// The engine's own validation decides whether the timeouts fit
	// together (lease > request timeout + store timeout); ask it now,
	// before any database is opened.
	if _, err := idem.New(c.idemConfig(memstore.MustNew())); err != nil {
		return errors.New(oneLine(err))
	}
	return nil
}

// idemConfig is the engine configuration for store; the caller adds the
// observer and the logger.
func (c *config) idemConfig(store idemstore.Store) idem.Config {
	return idem.Config{
		Store:          store,
		FingerprintKey: []byte(c.fingerprintKey),
		RequestTimeout: c.requestTimeout,
		Lease:          c.lease,
		StoreTimeout:   c.storeTimeout,
		DurableClaims:  c.durableClaims,
		WaitInFlight:   c.waitInFlight,
	}
}

// oneLine flattens a (possibly joined, multi-line) error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// loadKeyFile reads the fingerprint key from c.fingerprintKeyFile, creating
// the file with 32 random bytes (hex) when it does not exist. Instances
// started at once in one folder agree on one key: each writes its own key
// to a temporary file, syncs it and links it to the final name, which only
// the first link gets, so the file under that name is always whole; the
// others read the first one's key.
func (c *config) loadKeyFile() error {
	path := c.fingerprintKeyFile
	if path == "" {
		return errors.New("missing -fingerprint-key (env IDEM_FINGERPRINT_KEY) and -fingerprint-key-file: " +
			"the secret the request fingerprints are keyed with")
	}
	key, err := readKeyFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if c.keyFileCreated, err = createKeyFile(path); err == nil {
			key, err = readKeyFile(path)
		}
	}
	if err != nil {
		return fmt.Errorf("-fingerprint-key-file %s: %w", path, err)
	}
	c.fingerprintKey = key
	return nil
}

// keyFileSettle bounds how long readKeyFile waits for a key file that is
// short but was written a moment ago.
const keyFileSettle = 2 * time.Second

// readKeyFile returns the key the file at path holds, trimmed. A file
// shorter than a key whose last change is under keyFileSettle old may
// still be being written by a process that does not link it whole into
// place (an older build of this program, a shell redirect): it is read
// again until it holds a key or keyFileSettle has passed since that
// change.
func readKeyFile(path string) (string, error) {
	for {
		raw, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		key := strings.TrimSpace(string(raw))
		if len(key) >= idem.MinFingerprintKeyBytes {
			return key, nil
		}
		fi, err := os.Stat(path)
		if err != nil {
			return "", err
		}
		if time.Since(fi.ModTime()) >= keyFileSettle {
			return "", fmt.Errorf("holds %d bytes, want at least %d", len(key), idem.MinFingerprintKeyBytes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createKeyFile creates the file at path holding a new random key, unless
// a file is there already: then it leaves it as it is and reports false.
// The key is written and synced to a temporary file in the same folder,
// which is then hard-linked to path: a reader never sees the file under
// path empty or in part, and a file that exists is never replaced.
func createKeyFile(path string) (created bool, err error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*.tmp") // mode 0600
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	_, err = tmp.WriteString(hex.EncodeToString(b[:]) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, err
	}
	// Sync the folder, so that the new name survives a crash too. A
	// folder that cannot be synced (some file systems refuse) leaves the
	// file as durable as any written without it.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return true, nil
}
