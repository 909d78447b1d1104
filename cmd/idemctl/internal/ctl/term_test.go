package ctl

import (
	"os"
	"testing"
)

func TestIsTerminal(t *testing.T) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	if fi, err := devNull.Stat(); err == nil && fi.Mode()&os.ModeCharDevice == 0 {
		t.Logf("%s is not a character device here", os.DevNull)
	}
	if isTerminal(devNull) {
		t.Errorf("%s is taken for a terminal", os.DevNull)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if isTerminal(pr) {
		t.Error("a pipe is taken for a terminal")
	}
	// A pseudo-terminal's master side has terminal attributes.
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test the positive case: %v", err)
	}
	defer ptmx.Close()
	if !isTerminal(ptmx) {
		t.Error("a pseudo-terminal is not taken for a terminal")
	}
}
