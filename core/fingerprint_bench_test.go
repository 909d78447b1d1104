package idem

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkFingerprint is the fingerprint as Begin computes it, for the
// request body of adaptertest.Benchmarks and for larger JSON and raw bodies.
func BenchmarkFingerprint(b *testing.B) {
	var large strings.Builder
	large.WriteString(`{"items":[`)
	for i := range 64 {
		if i > 0 {
			large.WriteByte(',')
		}
		large.WriteString(`{"sku":"item-` + strconv.Itoa(i) + `","quantity":2,"price":12.5,"note":"two of these please"}`)
	}
	large.WriteString(`]}`)
	bodies := []struct {
		name, contentType, body string
	}{
		{"JSON55B", "application/json", `{"amount":1000,"currency":"EUR","description":"coffee"}`},
		{"JSON" + strconv.Itoa(large.Len()/1024) + "KiB", "application/json", large.String()},
		{"Raw" + strconv.Itoa(large.Len()/1024) + "KiB", "application/octet-stream", large.String()},
	}
	k := newFingerprintKey([]byte("bench-fingerprint-key-0123456789abcdef"))
	for _, bb := range bodies {
		b.Run(bb.name, func(b *testing.B) {
			body := []byte(bb.body)
			b.ReportAllocs()
			for b.Loop() {
				_ = k.fingerprint("POST", "/payments", "acct_1", bb.contentType, body, nil)
			}
		})
	}
}
