//go:build !(aix || linux || solaris || zos || darwin || dragonfly || freebsd || netbsd || openbsd)

package ctl

import "os"

// isTerminal reports false: on this system idemctl does not tell a
// terminal from a file, so release, complete and purge need --yes.
func isTerminal(*os.File) bool { return false }
