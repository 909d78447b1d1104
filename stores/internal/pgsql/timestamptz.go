package pgsql

import (
	"encoding/binary"
	"time"
)

// The range of PostgreSQL's timestamptz in its binary form, microseconds
// since 2000-01-01 UTC (MIN_TIMESTAMP and END_TIMESTAMP in its source):
// ±infinity lie outside it, and pgx refuses them for a time.Time.
const (
	unixToY2K    = 946_684_800 // seconds
	minTimestamp = -211_813_488_000_000_000
	endTimestamp = 9_223_371_331_200_000_000
)

// DecodeTimestamptz decodes a timestamptz in its binary form (what the
// server sends in binary format, and what timestamptz_send returns: eight
// bytes, big-endian microseconds since 2000-01-01 UTC) into a time in the
// local zone, as pgx's TimestamptzCodec does by default. It reports false
// for a value of the wrong size or outside the range (±infinity).
func DecodeTimestamptz(b []byte) (time.Time, bool) {
	if len(b) != 8 {
		return time.Time{}, false
	}
	us := int64(binary.BigEndian.Uint64(b))
	if us < minTimestamp || us >= endTimestamp {
		return time.Time{}, false
	}
	return time.Unix(unixToY2K+us/1_000_000, us%1_000_000*1_000), true
}
