package main

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestAlertRules checks alerts.yml with promtool (check rules, then the
// unit tests of alerts_test.yml) and that every metric it names is one
// idemprom exports. promtool is required: `make services` installs it
// (Debian's prometheus package); without it the test fails rather than
// skipping, so the rules are never reported checked when they were not.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is required to check alerts.yml (make services installs it: apt-get install prometheus): %v", err)
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}

	// The rules name idemprom's metrics, not names of their own.
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	names := regexp.MustCompile(`[a-z_:]*idem_[a-z_:]+`).FindAllString(string(rules), -1)
	if len(names) == 0 {
		t.Fatal("alerts.yml names no idem metric")
	}
	for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
		if strings.Contains(name, ":") {
			continue // a recording rule's name (level:metric:operations)
		}
		if !slices.Contains(exported, name) {
			t.Errorf("alerts.yml uses %s, which idemprom does not export (it exports %v)", name, exported)
		}
	}
}

// exportedMetrics lists the metric families the service's /metrics
// handler serves.
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	_, h, err := newMetrics()
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var names []string
	for line := range strings.Lines(rec.Body.String()) {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names = append(names, strings.Fields(rest)[0])
		}
	}
	return names
}
