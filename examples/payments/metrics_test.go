package main

import (
	"regexp"
	"strconv"
	"testing"
)

// requestSeriesRE is one idem_requests_total series of the text
// exposition: idemprom's labels are outcome and route, in that order.
var requestSeriesRE = regexp.MustCompile(`(?m)^idem_requests_total\{outcome="([a-z_]+)",route="([^"]*)"\} (\S+)$`)

// outcomeCount sums the idem_requests_total series of outcome over every
// route in a /metrics scrape; found is false when there is no such series.
func outcomeCount(t testing.TB, scrape, outcome string) (n float64, found bool) {
	t.Helper()
	for _, m := range requestSeriesRE.FindAllStringSubmatch(scrape, -1) {
		if m[1] != outcome {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("metrics series %q: %v", m[0], err)
		}
		n, found = n+v, true
	}
	return n, found
}
