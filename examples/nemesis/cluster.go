package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBin is where Debian's PostgreSQL 15 keeps its server programs.
const pgBin = "/usr/lib/postgresql/15/bin"

// cluster is a PostgreSQL cluster of the run's own: initdb'd into a
// temporary folder, its postmaster started inside the run's network
// namespace and listening only on the namespace's address, its Unix socket
// in the same folder (Unix sockets are not namespaced, so the checker and
// the admin statements reach it whatever the network does).
type cluster struct {
	dir    string // the data directory's parent, owned by the server's user
	data   string
	ns     *netns
	port   int
	runAs  string // PostgreSQL refuses to run as root
	params []string
}

// newCluster initdb's a cluster under dir (created, owned by the postgres
// user when running as root).
func newCluster(ctx context.Context, dir string, ns *netns, port int) (*cluster, error) {
	c := &cluster{dir: dir, data: filepath.Join(dir, "data"), ns: ns, port: port}
	runAs, err := ownAsServer(dir, "postgres")
	if err != nil {
		return nil, err
	}
	c.runAs = runAs
	if out, err := c.pg(ctx, "initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(out, 5))
	}
	// Trust the services' end of the veth, and nothing else over TCP.
	hba, err := os.OpenFile(filepath.Join(c.data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(hba, "host all all %s/32 trust\n", ns.outer)
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pg_hba.conf: %w", err)
	}
	c.params = []string{
		"listen_addresses=" + ns.inner,
		"port=" + strconv.Itoa(port),
		"unix_socket_directories=" + dir,
		"max_connections=200",
		"shared_buffers=64MB",
		"logging_collector=off",
		"log_min_messages=warning",
	}
	return c, nil
}

// replicate makes a streaming replica of c (pg_basebackup -R) in the
// folder's replica-<port> directory, listening on port, and starts it.
func (c *cluster) replicate(ctx context.Context, port int) (*cluster, error) {
	r := *c
	r.port = port
	r.data = filepath.Join(c.dir, "replica-"+strconv.Itoa(port))
	r.params = append([]string{}, c.params...)
	for i, p := range r.params {
		if strings.HasPrefix(p, "port=") {
			r.params[i] = "port=" + strconv.Itoa(port)
		}
	}
	out, err := c.pg(ctx, "pg_basebackup", "-D", r.data, "-R", "-X", "stream", "-c", "fast",
		"-h", c.dir, "-p", strconv.Itoa(c.port), "-U", "postgres").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w: %s", err, lastLines(out, 3))
	}
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	return &r, nil
}

// promote turns a replica into a primary.
func (c *cluster) promote(ctx context.Context) error {
	out, err := c.pg(ctx, "pg_ctl", "promote", "-D", c.data, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, lastLines(out, 3))
	}
	return nil
}

// pg is a command of the server's programs, as the server's user, inside
// the namespace.
func (c *cluster) pg(ctx context.Context, prog string, args ...string) *exec.Cmd {
	argv := []string{}
	if c.ns != nil {
		argv = append(argv, "ip", "netns", "exec", c.ns.name)
	}
	if c.runAs != "" {
		argv = append(argv, "runuser", "-u", c.runAs, "--")
	}
	argv = append(argv, filepath.Join(pgBin, prog))
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = c.dir
	return cmd
}

// start starts the postmaster and waits until it accepts connections.
func (c *cluster) start(ctx context.Context) error {
	opts := ""
	for _, p := range c.params {
		opts += " -c " + p
	}
	out, err := c.pg(ctx, "pg_ctl", "start", "-D", c.data, "-w", "-t", "60", "-l", c.logPath(), "-o", opts).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s; server log: %s", err, lastLines(out, 3), c.logTail(5))
	}
	return nil
}

// crash stops the server with -m immediate: no shutdown checkpoint, and
// whatever WAL the WAL writer had not written yet (asynchronously
// committed transactions) is gone.
func (c *cluster) crash(ctx context.Context) error {
	out, err := c.pg(ctx, "pg_ctl", "stop", "-D", c.data, "-m", "immediate", "-w", "-t", "30").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m immediate: %w: %s", err, lastLines(out, 3))
	}
	return nil
}

// stop stops the server if it runs; used by the clean-up.
func (c *cluster) stop() error {
	if _, err := os.Stat(filepath.Join(c.data, "postmaster.pid")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.crash(ctx)
}

// socketDSN reaches database db over the Unix socket, outside the faulted
// network.
func (c *cluster) socketDSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable connect_timeout=5", c.dir, c.port, db)
}

// admin runs statements on database db over the socket.
func (c *cluster) admin(ctx context.Context, db string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.socketDSN(db))
	if err != nil {
		return fmt.Errorf("connect to the run's cluster: %w", err)
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func (c *cluster) listenPort() int { return c.port }

func (c *cluster) recreate(ctx context.Context, name string) error {
	return c.admin(ctx, "postgres", "DROP DATABASE IF EXISTS "+name, "CREATE DATABASE "+name)
}

func (c *cluster) serviceDSN(addr, name string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=3", addr, name)
}

func (c *cluster) readRows(ctx context.Context, name string, st *dbState) error {
	conn, err := pgx.Connect(ctx, c.socketDSN(name))
	if err != nil {
		return fmt.Errorf("connect for the check: %w", err)
	}
	defer conn.Close(context.Background())
	for _, q := range []struct {
		sql string
		add func(a, b string)
	}{
		{paymentsQuery, func(acct, id string) { st.payments[acct] = append(st.payments[acct], id) }},
		{recordsQuery, func(p, s string) { st.records[p] = s }},
	} {
		rows, err := conn.Query(ctx, q.sql)
		if err != nil {
			return fmt.Errorf("%s: %w", q.sql, err)
		}
		var a, b string
		if _, err := pgx.ForEachRow(rows, []any{&a, &b}, func() error { q.add(a, b); return nil }); err != nil {
			return fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	return nil
}

func (c *cluster) logPath() string { return filepath.Join(c.dir, filepath.Base(c.data)+".log") }

func (c *cluster) logTail(n int) string {
	b, _ := os.ReadFile(c.logPath())
	return lastLines(b, n)
}

// lastLines is the last n lines of b, joined by " | ".
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ownAsServer gives dir to the server's system user (postgres, mysql) when
// running as root, since neither server runs as root, and returns that
// user's name; otherwise it returns "" and the server runs as the caller.
func ownAsServer(dir, name string) (runAs string, err error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return "", fmt.Errorf("running as root needs the %s user to own the server's files: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return "", err
	}
	return name, nil
}
