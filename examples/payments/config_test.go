package main

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBadConfig: every bad value exits non-zero with one line on stderr,
// before anything is opened.
func TestBadConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"-framework", "rails"}, want: `invalid -framework "rails"`},
		{args: []string{"-store", "mongo"}, want: `invalid -store "mongo"`},
		{args: []string{"-lease", "3s"}, want: "Lease (3s) must exceed RequestTimeout + StoreTimeout (35s)"},
		{args: []string{"-request-timeout", "10s", "-lease", "12s"}, want: "Lease (12s) must exceed"},
		{args: []string{"-request-timeout", "soon"}, want: `invalid value "soon" for flag -request-timeout`},
		{args: []string{"-handler-delay", "-1s"}, want: "invalid -handler-delay -1s"},
		{args: []string{"-wait-in-flight", "-1s"}, want: "invalid -wait-in-flight -1s"},
		{args: []string{"-wait-in-flight", "1m"}, want: "WaitInFlight (1m0s) must be 0 (no wait) or positive and below Lease (40s)"},
		{args: []string{"-addr", "nowhere"}, want: `invalid -addr "nowhere"`},
		{args: []string{"-bogus"}, want: "flag provided but not defined: -bogus"},
		{args: []string{"extra"}, want: `unexpected argument "extra"`},
		{args: []string{"-provider-url", "https://pay.example"}, want: `invalid -provider-url "https://pay.example"`},
		{env: []string{"IDEM_PROVIDER_URL=127.0.0.1:8090"}, want: `invalid -provider-url "127.0.0.1:8090"`},
		{env: []string{"IDEM_FRAMEWORK=rails"}, want: `invalid -framework "rails"`},
		{env: []string{"IDEM_LEASE=long"}, want: `invalid value "long" for IDEM_LEASE`},
		{env: []string{"IDEM_SIMULATE_FAILURES=maybe"}, want: "IDEM_SIMULATE_FAILURES"},
		{env: []string{"IDEM_FINGERPRINT_KEY="}, args: []string{"-fingerprint-key-file", ""}, want: "missing -fingerprint-key (env IDEM_FINGERPRINT_KEY) and -fingerprint-key-file"},
		{env: []string{"IDEM_FINGERPRINT_KEY="}, args: []string{"-fingerprint-key-file", "/nonexistent/idem.key"}, want: "-fingerprint-key-file /nonexistent/idem.key: open"},
		{args: []string{"-fingerprint-key", "0123456789abcdef"}, want: "invalid (16 bytes) -fingerprint-key"},
		{args: []string{"-store", "pgx", "-dsn", "postgres://127.0.0.1:1/x?connect_timeout=2"}, want: "connect "},
		{args: []string{"-store", "redis", "-dsn", "http://127.0.0.1:6379"}, want: "invalid -dsn for redis"},
		{args: []string{"-store", "redis", "-dsn", "redis://127.0.0.1:1/0"}, want: "connect redis 127.0.0.1:1/0"},
		{args: []string{"-store", "redis", "-payments-db", "file:x.db?mode=memory"}, want: "invalid -payments-db"},
	} {
		cmd := exec.Command(binPath, c.args...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "IDEM_FINGERPRINT_KEY=" + testFingerprintKey}, c.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		err := cmd.Run()
		out := strings.TrimRight(stderr.String(), "\n")
		if err == nil || cmd.ProcessState.ExitCode() == 0 {
			t.Errorf("%v %v: exit 0, want non-zero", c.env, c.args)
		}
		if strings.Contains(out, "\n") || !strings.Contains(out, c.want) || !strings.HasPrefix(out, "payments: ") {
			t.Errorf("%v %v: stderr %q, want one line containing %q", c.env, c.args, out, c.want)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%v %v took %v", c.env, c.args, d)
		}
	}
}

// TestEnvAndFlags: IDEM_* variables are defaults, flags override them.
func TestEnvAndFlags(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig([]string{"-framework", "nethttp", "-handler-delay", "1s"}, func(k string) string {
		return map[string]string{
			"IDEM_FRAMEWORK": "echo", "IDEM_STORE": "memory", "IDEM_LEASE": "50s",
			"IDEM_SIMULATE_FAILURES": "true", "IDEM_HANDLER_DELAY": "5s", "IDEM_DURABLE_CLAIMS": "true", "IDEM_FINGERPRINT_KEY": testFingerprintKey,
		}[k]
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.framework != "nethttp" || cfg.store != "memory" || cfg.lease != 50*time.Second ||
		!cfg.simulateFailures || cfg.handlerDelay != time.Second || cfg.addr != "127.0.0.1:8080" ||
		!cfg.idemConfig(nil).DurableClaims {
		t.Fatalf("%+v", cfg)
	}
}

// TestKeyFile: without -fingerprint-key the service keeps its key in a
// file it creates once (mode 0600) and reads on every later start, so
// `go run ./examples/payments` works and its records stay comparable
// across restarts.
func TestKeyFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.key")
	getenv := func(k string) string {
		return map[string]string{"IDEM_STORE": "memory", "IDEM_FINGERPRINT_KEY_FILE": path}[k]
	}
	first, err := parseConfig(nil, getenv, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || !first.keyFileCreated || len(first.fingerprintKey) != 64 {
		t.Fatalf("first start: %v %v created=%v key %d bytes; want a new 0600 file with 64 hex digits", fi, err, first.keyFileCreated, len(first.fingerprintKey))
	}
	second, err := parseConfig(nil, getenv, nil)
	if err != nil || second.keyFileCreated || second.fingerprintKey != first.fingerprintKey {
		t.Fatalf("second start: %v created=%v, same key %v; want the first key read back", err, second.keyFileCreated, second.fingerprintKey == first.fingerprintKey)
	}
	flagged, err := parseConfig([]string{"-fingerprint-key", testFingerprintKey}, getenv, nil)
	if err != nil || flagged.fingerprintKey != testFingerprintKey {
		t.Fatalf("-fingerprint-key given: %v %q; want the flag's key, the file ignored", err, flagged.fingerprintKey)
	}
}

// TestKeyFileAtOnce: instances started at once in one folder, none with a
// key file yet, all read one whole key: the file appears under its name
// only once it holds the key, and the one that made it is the only one to
// say so. Goroutines, many rounds, to meet the moment between the file's
// creation and its write.
func TestKeyFileAtOnce(t *testing.T) {
	t.Parallel()
	const rounds, instances = 50, 16
	for round := range rounds {
		dir := t.TempDir()
		path := filepath.Join(dir, defaultKeyFile)
		var (
			start   = make(chan struct{})
			wg      sync.WaitGroup
			configs [instances]config
			errs    [instances]error
		)
		for i := range instances {
			wg.Go(func() {
				configs[i].fingerprintKeyFile = path
				<-start
				errs[i] = configs[i].loadKeyFile()
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for i := range instances {
			c := configs[i]
			if errs[i] != nil {
				t.Fatalf("round %d, instance %d: %v", round, i, errs[i])
			}
			if _, err := hex.DecodeString(c.fingerprintKey); err != nil || len(c.fingerprintKey) != 64 || c.fingerprintKey != configs[0].fingerprintKey {
				t.Fatalf("round %d, instance %d read key %q, instance 0 %q; want one key of 64 hex digits", round, i, c.fingerprintKey, configs[0].fingerprintKey)
			}
			if c.keyFileCreated {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("round %d: %d instances say they created the file, want 1", round, created)
		}
		entries, _ := os.ReadDir(dir)
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || len(entries) != 1 {
			t.Fatalf("round %d: %v %v, %d files in the folder; want the key file alone, mode 0600", round, fi, err, len(entries))
		}
	}
}

// TestKeyFileAtOnceProcesses: payments processes started at once with one
// key file that does not exist yet all get past it (and stop at the bad
// -lease that follows it in the checks), instead of one reading the file
// empty and exiting.
func TestKeyFileAtOnceProcesses(t *testing.T) {
	t.Parallel()
	const rounds, instances = 5, 8
	for round := range rounds {
		path := filepath.Join(t.TempDir(), defaultKeyFile)
		var (
			wg     sync.WaitGroup
			cmds   [instances]*exec.Cmd
			stderr [instances]bytes.Buffer
		)
		for i := range instances {
			cmds[i] = exec.Command(binPath, "-fingerprint-key-file", path, "-lease", "3s")
			cmds[i].Env = []string{"PATH=/usr/bin:/bin"}
			cmds[i].Stderr = &stderr[i]
		}
		for i := range instances {
			if err := cmds[i].Start(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range instances {
			wg.Go(func() { _ = cmds[i].Wait() })
		}
		wg.Wait()
		for i := range instances {
			if out := stderr[i].String(); !strings.Contains(out, "Lease (3s) must exceed") {
				t.Errorf("round %d, process %d: %q; want it past the key file, at the -lease check", round, i, out)
			}
		}
		raw, err := os.ReadFile(path)
		if err != nil || len(strings.TrimSpace(string(raw))) != 64 {
			t.Fatalf("round %d: key file %q, %v; want 64 hex digits", round, raw, err)
		}
	}
}

// TestKeyFileBeingWritten: a key file that exists but is still empty, as
// one that another process is writing in place is for a moment, is read
// once it holds the key; one that has been empty for a while is refused
// at once.
func TestKeyFileBeingWritten(t *testing.T) {
	t.Parallel()
	const key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	path := filepath.Join(t.TempDir(), defaultKeyFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	c := &config{fingerprintKeyFile: path}
	go func() { done <- c.loadKeyFile() }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("loadKeyFile returned %v before the file held a key", err)
	default:
	}
	if _, err := f.WriteString(key + "\n"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if err := <-done; err != nil || c.fingerprintKey != key || c.keyFileCreated {
		t.Fatalf("%v, key %q, created %v; want the key the writer wrote", err, c.fingerprintKey, c.keyFileCreated)
	}

	stale := filepath.Join(t.TempDir(), defaultKeyFile)
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = (&config{fingerprintKeyFile: stale}).loadKeyFile()
	if err == nil || !strings.Contains(err.Error(), "holds 0 bytes, want at least 32") || time.Since(start) > time.Second {
		t.Fatalf("an empty file a minute old: %v after %v; want it refused at once", err, time.Since(start))
	}
}
