package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// buildPayments builds examples/payments into dir and returns the binary's
// path. The program runs from the examples module (make nemesis), so the
// package is ./payments relative to it, found from this source's module.
func buildPayments(ctx context.Context, dir string, race bool) (string, error) {
	bin := filepath.Join(dir, "payments")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "github.com/idemgo/idem/examples/payments")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build examples/payments: %w: %s", err, lastLines(out, 10))
	}
	return bin, nil
}

var listenRE = regexp.MustCompile(`msg="(?:payments service|fake payment provider) listening" addr=(\S+)`)

// instance is one process of the example service (or its fake provider).
// Its address stays the same across restarts, so clients keep their list.
type instance struct {
	name string
	bin  string
	args []string
	log  *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	addr string
}

// start starts the process and waits for its "listening" line; addr is
// 127.0.0.1:0 the first time and the port it got afterwards.
func (in *instance) start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	addr := in.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	cmd := exec.Command(in.bin, append([]string{"-addr", addr}, in.args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = in.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", in.name, err)
	}
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(in.log, line)
			if m := listenRE.FindStringSubmatch(line); m != nil && !sent {
				got <- m[1]
				sent = true
			}
		}
		_, _ = io.Copy(in.log, stderr)
	}()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case a := <-got:
		in.cmd, in.done, in.addr = cmd, done, a
		return nil
	case <-done:
		return fmt.Errorf("%s exited at start-up (%v); its log: %s", in.name, cmd.ProcessState, in.logPath())
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("%s did not start listening in time; its log: %s", in.name, in.logPath())
}

// startRetrying starts the process, again and again for up to d: a service
// refuses to start while its database is unreachable.
func (in *instance) startRetrying(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := in.start(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

// kill SIGKILLs the process and waits for it; a no-op when it is not
// running.
func (in *instance) kill() {
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// stop ends the process gracefully (SIGTERM), then by SIGKILL after 10s.
func (in *instance) stop() error {
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	return nil
}

func (in *instance) base() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return "http://" + in.addr
}

func (in *instance) logPath() string { return in.log.Name() }

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// join is strings.Join for the summary's lists.
func join(parts []string) string { return strings.Join(parts, ",") }
