package pgsql_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/idemgo/idem/stores/internal/pgsql"
)

func TestDecodeTimestamptz(t *testing.T) {
	be := func(us int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(us)) }
	y2k := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		in   []byte
		want time.Time
		ok   bool
	}{
		{"epoch", be(0), y2k, true},
		{"a microsecond before", be(-1), y2k.Add(-time.Microsecond), true},
		{"a day after", be(86_400_000_000), y2k.AddDate(0, 0, 1), true},
		{"infinity", be(math.MaxInt64), time.Time{}, false},
		{"-infinity", be(math.MinInt64), time.Time{}, false},
		{"short", []byte{0, 1}, time.Time{}, false},
		{"nil", nil, time.Time{}, false},
	} {
		got, ok := pgsql.DecodeTimestamptz(tc.in)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("%s: DecodeTimestamptz = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
