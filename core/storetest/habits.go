package storetest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	gotoken "go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Habit is handler code written against a store's transaction handle, for
// CheckHabits.
type Habit struct {
	// Name names the subtest.
	Name string
	// Body is the code, put into the file CheckHabits is given.
	Body string
	// Want is what the only type error must say; "" when the code must
	// compile.
	Want string
}

// CheckHabits type-checks each habit's Body, put into file (Go source of a
// package with one %s verb where the Body goes), with go/types against the
// packages pkgs as they are built now (go list -export, from the build
// cache when nothing changed), so that a habit that must not compile fails
// the test as soon as the handle grows the method it needs, and one that
// must compile (sqlc's generated code on the handle) fails as soon as the
// handle loses one. pkgs are the import paths file needs, besides the
// standard library.
func CheckHabits(t *testing.T, file string, habits []Habit, pkgs ...string) {
	t.Helper()
	exports := exportData(t, pkgs...)
	fset := gotoken.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(f)
	})
	for _, h := range habits {
		t.Run(h.Name, func(t *testing.T) {
			f, err := parser.ParseFile(fset, "habit.go", fmt.Sprintf(file, h.Body), parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("the habit does not parse: %v", err)
			}
			var errs []string
			conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err.Error()) }}
			_, _ = conf.Check("habit", fset, []*ast.File{f}, nil)
			switch {
			case h.Want == "" && len(errs) > 0:
				t.Fatalf("does not compile:\n%s\n%s", h.Body, strings.Join(errs, "\n"))
			case h.Want != "" && len(errs) == 0:
				t.Fatalf("compiles, and must not:\n%s", h.Body)
			case h.Want != "" && (len(errs) != 1 || !strings.Contains(errs[0], h.Want)):
				t.Fatalf("fails to compile with\n%s\nwant exactly one error, saying %q", strings.Join(errs, "\n"), h.Want)
			}
			if len(errs) > 0 && testing.Verbose() {
				t.Log(errs[0])
			}
		})
	}
}

// exportData builds pkgs and their dependencies as the go command does
// and returns each package's export data file by import path.
func exportData(t *testing.T, pkgs ...string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}}={{.Export}}{{end}}"}, pkgs...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	exports := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, file, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			exports[path] = file
		}
	}
	for _, p := range pkgs {
		if exports[p] == "" {
			t.Fatalf("go list -export gave no export data for %s", p)
		}
	}
	return exports
}

// CheckNotLinked fails the test when a program that imports exactly pkgs
// would link a package whose import path starts with one of forbidden. A
// program's packages are the union of its imports' dependencies, so the
// packages go list -deps lists for pkgs are those of such a program. It
// fails too when go list does not list pkgs themselves, so that a check
// that lists nothing cannot pass.
func CheckNotLinked(t *testing.T, forbidden []string, pkgs ...string) {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	listed := map[string]bool{}
	for _, d := range deps {
		listed[d] = true
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("a program importing %s links %s", strings.Join(pkgs, " and "), d)
			}
		}
	}
	for _, p := range pkgs {
		if !listed[p] {
			t.Fatalf("go list -deps does not list %s itself:\n%s", p, out)
		}
	}
}
