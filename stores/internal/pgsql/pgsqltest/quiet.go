// Package pgsqltest starts throwaway PostgreSQL servers for the tests of
// the PostgreSQL stores, where the shared test server cannot show what
// they check: a server on which nothing else happens.
package pgsqltest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// QuietServer starts a PostgreSQL server of t's own, from the binaries of
// the newest PostgreSQL installed under /usr/lib/postgresql, on a free
// port of 127.0.0.1 with trust authentication and autovacuum off, and
// returns the DSN of its database "test" (user postgres). Nothing but t
// connects to it, so nothing commits there unless t does. The server is
// stopped and its files removed when t ends.
//
// It fails t, and never skips it, when the binaries are missing or the
// server does not start within 30 seconds. Run as root, it runs the server
// as the system user postgres, since PostgreSQL refuses to run as root.
func QuietServer(t testing.TB) string {
	t.Helper()
	dsn, err := startQuiet(t)
	if err != nil {
		t.Fatalf("pgsqltest: a quiet PostgreSQL server: %v", err)
	}
	return dsn
}

func startQuiet(t testing.TB) (string, error) {
	bin, err := binDir()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "idem-quiet-pg-")
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cred, err := serverUser(dir)
	if err != nil {
		return "", err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// The port is free when freePort returns, but something else may take
	// it before the server binds it: then the server exits, and it starts
	// again on another port.
	var lastErr error
	for range 3 {
		dsn, exited, err := serve(t, bin, dir, data, cred)
		if err == nil {
			return dsn, nil
		}
		lastErr = err
		if !exited {
			break
		}
	}
	return "", lastErr
}

// serve starts the server on data, on a free port, and creates its
// database test. exited is true when the server exited before it accepted
// connections.
func serve(t testing.TB, bin, dir, data string, cred *syscall.Credential) (dsn string, exited bool, err error) {
	port, err := freePort()
	if err != nil {
		return "", false, err
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return "", false, err
	}
	defer logFile.Close()
	server := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "autovacuum=off")
	server.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	server.Stdout, server.Stderr = logFile, logFile
	if err := server.Start(); err != nil {
		return "", false, fmt.Errorf("postgres: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- server.Wait() }()
	stop := func() {
		_ = server.Process.Signal(syscall.SIGQUIT) // immediate shutdown
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = server.Process.Kill()
			<-done
		}
	}
	// psql, the client installed with the server, creates the database:
	// the first time it succeeds the server accepts connections.
	deadline := time.Now().Add(30 * time.Second)
	for {
		create := exec.Command(filepath.Join(bin, "psql"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres",
			"-d", "postgres", "-c", "CREATE DATABASE test")
		out, err := create.CombinedOutput()
		if err == nil {
			break
		}
		select {
		case werr := <-done:
			log, _ := os.ReadFile(logFile.Name())
			return "", true, fmt.Errorf("the server exited (%v):\n%s", werr, log)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(logFile.Name())
			return "", false, fmt.Errorf("the server did not accept connections within 30s: %s\n%s", out, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(stop)
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port), false, nil
}

// binDir returns the bin folder of the newest PostgreSQL under
// /usr/lib/postgresql that has initdb, postgres and psql.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		ok := true
		for _, name := range []string{"initdb", "postgres", "psql"} {
			if _, err := os.Stat(filepath.Join(d, name)); err != nil {
				ok = false
			}
		}
		if ok {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres, psql) under /usr/lib/postgresql/*/bin; scripts/services.sh installs them")
}

// serverUser returns the credentials to run the server with: nil (the
// test's own) unless the test runs as root, then the system user postgres,
// who is given dir.
func serverUser(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the server needs the system user postgres: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
