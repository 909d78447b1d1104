//go:build aix || linux || solaris || zos || darwin || dragonfly || freebsd || netbsd || openbsd

package ctl

import (
	"os"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal: whether it has terminal
// attributes, as golang.org/x/term.IsTerminal asks. Its mode alone does not
// tell: /dev/null is a character device too.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlReadTermios)
	return err == nil
}
