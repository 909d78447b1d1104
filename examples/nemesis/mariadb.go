package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mariadb is a MariaDB server of the run's own, for the gorm-mysql store:
// its data directory installed into a temporary folder (mariadb-install-db),
// mariadbd started inside the run's namespace and listening only on the
// namespace's address, its Unix socket in the same folder for the checker
// and the admin statements. Its claims commit durably
// (innodb_flush_log_at_trx_commit=1, the default), so a crash takes back no
// committed claim.
type mariadb struct {
	dir   string // owned by the server's user
	data  string
	ns    *netns
	port  int
	runAs string

	cmd  *exec.Cmd
	done chan struct{}
}

// newMariaDB installs an empty data directory under dir (created, owned by
// the mysql user when running as root).
func newMariaDB(ctx context.Context, dir string, ns *netns, port int) (*mariadb, error) {
	m := &mariadb{dir: dir, data: filepath.Join(dir, "data"), ns: ns, port: port}
	runAs, err := ownAsServer(dir, "mysql")
	if err != nil {
		return nil, err
	}
	m.runAs = runAs
	args := []string{"mariadb-install-db", "--no-defaults", "--datadir=" + m.data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if m.runAs != "" {
		args = append(args, "--user="+m.runAs)
	}
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mariadb-install-db: %w: %s", err, lastLines(out, 5))
	}
	return m, nil
}

func (m *mariadb) socket() string  { return filepath.Join(m.dir, "sock") }
func (m *mariadb) logPath() string { return filepath.Join(m.dir, "mariadbd.log") }

// start starts mariadbd and waits until it answers on its socket. The
// first start lets the services' user (root, over TCP from the host's end
// of the veth) in.
func (m *mariadb) start(ctx context.Context) error {
	argv := []string{"ip", "netns", "exec", m.ns.name}
	if m.runAs != "" {
		argv = append(argv, "runuser", "-u", m.runAs, "--")
	}
	argv = append(argv, "/usr/sbin/mariadbd", "--no-defaults", "--datadir="+m.data,
		"--bind-address="+m.ns.inner, "--port="+strconv.Itoa(m.port), "--socket="+m.socket(),
		"--pid-file="+filepath.Join(m.dir, "pid"), "--log-error="+m.logPath(),
		"--innodb-buffer-pool-size=64M", "--max-connections=300", "--skip-name-resolve")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mariadbd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.cmd, m.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := m.admin(ctx, "", "CREATE USER IF NOT EXISTS 'root'@'"+m.ns.outer+"'",
			"GRANT ALL PRIVILEGES ON *.* TO 'root'@'"+m.ns.outer+"'")
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("mariadbd exited at start-up: %s", m.logTail(5))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("mariadbd did not answer in time (%v): %s", err, m.logTail(5))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crash SIGKILLs mariadbd (its pid file names it: the process started is
// ip netns exec and runuser): no shutdown, InnoDB recovers at the next
// start.
func (m *mariadb) crash(context.Context) error {
	if m.cmd == nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(m.dir, "pid"))
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		return errors.New("mariadbd did not end after SIGKILL")
	}
	m.cmd = nil
	return nil
}

func (m *mariadb) stop() error { return m.crash(context.Background()) }

func (m *mariadb) listenPort() int { return m.port }

func (m *mariadb) recreate(ctx context.Context, name string) error {
	return m.admin(ctx, "", "DROP DATABASE IF EXISTS "+name, "CREATE DATABASE "+name)
}

func (m *mariadb) serviceDSN(addr, name string) string {
	return fmt.Sprintf("root@tcp(%s)/%s?timeout=3s", addr, name)
}

// open reaches database name (none when empty) over the socket.
func (m *mariadb) open(name string) (*sql.DB, error) {
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr, c.DBName, c.Timeout = "root", "unix", m.socket(), name, 5*time.Second
	conn, err := mysql.NewConnector(c)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

func (m *mariadb) admin(ctx context.Context, name string, stmts ...string) error {
	db, err := m.open(name)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func (m *mariadb) readRows(ctx context.Context, name string, st *dbState) error {
	db, err := m.open(name)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := scanPairs(ctx, db, paymentsQuery, func(acct, id string) { st.payments[acct] = append(st.payments[acct], id) }); err != nil {
		return err
	}
	return scanPairs(ctx, db, recordsQuery, func(p, s string) { st.records[p] = s })
}

func (m *mariadb) logTail(n int) string {
	b, _ := os.ReadFile(m.logPath())
	return lastLines(b, n)
}
