package idempgx

import (
	"encoding/binary"
	"fmt"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/stores/internal/pgsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// scanRecord scans pgsql.RecordCols, followed by now() when now is not nil.
func scanRecord(row pgx.Row, now *time.Time) (idem.Record, error) {
	s := &recordScanner{now: now}
	if err := row.Scan(s); err != nil {
		return idem.Record{}, err
	}
	return s.rec, nil
}

// recordScanner is the pgx.RowScanner of scanRecord. A row of the table's
// own column types, its columns other than text in binary format (as every
// exec mode but Exec and SimpleProtocol receives it), is decoded straight
// from its raw values (decodeBinary), as pgx's default type map would
// decode it into the same Go types; any other row (text format, other
// column types, a connection whose type map registered its own codec for
// one of them, a NULL or a value the decoding refuses) goes through pgx's
// Scan, so its errors and values are pgx's own. Everything a scan needs lives in this
// one value.
type recordScanner struct {
	now *time.Time

	rec  idem.Record
	resp idem.Response

	// scanGeneric's destinations.
	state   string
	status  *int32
	headers []byte
	body    []byte
	dest    [16]any
}

func (s *recordScanner) ScanRow(rows pgx.Rows) error {
	if c := rows.Conn(); c != nil && pgxDecodes(c.TypeMap()) {
		if ok, err := s.decodeBinary(rows.FieldDescriptions(), rows.RawValues()); ok {
			return err
		}
	}
	return s.scanGeneric(rows)
}

// recordTypes are the distinct types of recordOIDs, and defaultTypes pgx's
// own for them, which decodeBinary decodes as pgx does.
var (
	recordTypes  = [...]uint32{pgtype.TextOID, pgtype.ByteaOID, pgtype.TimestamptzOID, pgtype.BoolOID, pgtype.Int4OID}
	defaultTypes = func() (t [len(recordTypes)]*pgtype.Type) {
		m := pgtype.NewMap()
		for i, oid := range recordTypes {
			t[i], _ = m.TypeForOID(oid)
		}
		return t
	}()
)

// pgxDecodes reports whether m decodes the record's types with pgx's own
// codecs: a connection that registered another (a timestamptz codec with
// a ScanLocation, say) is scanned by pgx, as it asked.
func pgxDecodes(m *pgtype.Map) bool {
	for i, oid := range recordTypes {
		if t, _ := m.TypeForOID(oid); t != defaultTypes[i] {
			return false
		}
	}
	return true
}

// scanRaw is ScanRow for a row's raw values, with the connection's type
// map m: decodeBinary where it decodes the row, else m's scan plans, as
// pgx's Rows.Scan would run them.
func (s *recordScanner) scanRaw(m *pgtype.Map, fds []pgconn.FieldDescription, vals [][]byte) error {
	if pgxDecodes(m) {
		if ok, err := s.decodeBinary(fds, vals); ok {
			return err
		}
	}
	return s.scanWith(func(dest ...any) error {
		if len(fds) != len(dest) || len(vals) != len(dest) {
			return fmt.Errorf("number of field descriptions must equal number of destinations, got %d and %d", len(fds), len(dest))
		}
		for i := range dest {
			if err := m.Scan(fds[i].DataTypeOID, fds[i].Format, vals[i], dest[i]); err != nil {
				return fmt.Errorf("can't scan into dest[%d] (col: %s): %w", i, fds[i].Name, err)
			}
		}
		return nil
	})
}

// scanGeneric scans through pgx's type map.
func (s *recordScanner) scanGeneric(rows pgx.Rows) error { return s.scanWith(rows.Scan) }

// scanWith scans the record's columns with scan.
func (s *recordScanner) scanWith(scan func(dest ...any) error) error {
	rec := &s.rec
	dest := append(s.dest[:0], &rec.Principal, &rec.Key, &rec.Fingerprint, &s.state, &rec.LeaseToken,
		&rec.RequestID, &rec.Nonce, &rec.CreatedAt, &rec.LockedAt, &rec.LeaseExpiresAt, &rec.ExpiresAt,
		&rec.Uncertain, &s.status, &s.headers, &s.body)
	if s.now != nil {
		dest = append(dest, s.now)
	}
	if err := scan(dest...); err != nil {
		return err
	}
	rec.State = idemstore.State(s.state)
	if s.status == nil {
		return nil
	}
	return s.setResponse(*s.status, s.headers, s.body)
}

// setResponse sets the record's response; headers are decoded, body is
// kept (and must not alias pgx's buffers).
func (s *recordScanner) setResponse(status int32, headers, body []byte) error {
	hdr, err := idemstore.DecodeHeader(headers)
	if err != nil {
		return fmt.Errorf("decode stored headers: %w", err)
	}
	if body == nil {
		body = []byte{}
	}
	s.resp = idem.Response{Status: int(status), Header: hdr, Body: body}
	s.rec.Response = &s.resp
	return nil
}

// recordOIDs are the types of pgsql.RecordCols and now(), in order, as the
// table has them.
var recordOIDs = [...]uint32{
	pgtype.TextOID, pgtype.TextOID, pgtype.ByteaOID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID,
	pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID,
	pgtype.BoolOID, pgtype.Int4OID, pgtype.ByteaOID, pgtype.ByteaOID,
	pgtype.TimestamptzOID,
}

// notNullCols is how many of RecordCols come first and are NOT NULL
// (status, headers and body may be NULL).
const notNullCols = 12

// decodeBinary decodes a row in binary format. ok is false when the row is
// not one it decodes: then scanGeneric scans it, over whatever this left.
func (s *recordScanner) decodeBinary(fds []pgconn.FieldDescription, vals [][]byte) (ok bool, err error) {
	n := len(recordOIDs) - 1
	if s.now != nil {
		n++
	}
	if len(fds) != n || len(vals) != n {
		return false, nil
	}
	for i := range fds {
		// pgx asks for text columns in text format, which is their binary
		// one too, and decodes both alike.
		if fds[i].DataTypeOID != recordOIDs[i] || fds[i].Format != pgx.BinaryFormatCode && recordOIDs[i] != pgtype.TextOID {
			return false, nil
		}
		if vals[i] == nil && (i < notNullCols || i == len(recordOIDs)-1) {
			return false, nil
		}
	}
	rec := &s.rec
	if !timestamptz(vals[7], &rec.CreatedAt) || !timestamptz(vals[8], &rec.LockedAt) ||
		!timestamptz(vals[9], &rec.LeaseExpiresAt) || !timestamptz(vals[10], &rec.ExpiresAt) ||
		s.now != nil && !timestamptz(vals[15], s.now) {
		return false, nil
	}
	if len(vals[11]) != 1 || vals[12] != nil && len(vals[12]) != 4 {
		return false, nil
	}
	rec.Principal = string(vals[0])
	rec.Key = string(vals[1])
	rec.Fingerprint = bytea(vals[2])
	rec.State = state(vals[3])
	rec.LeaseToken = string(vals[4])
	rec.RequestID = string(vals[5])
	rec.Nonce = string(vals[6])
	rec.Uncertain = vals[11][0] == 1
	if vals[12] == nil {
		return true, nil
	}
	return true, s.setResponse(int32(binary.BigEndian.Uint32(vals[12])), vals[13], bytea(vals[14]))
}

// bytea copies b as pgx does: nil for NULL, else a new slice, empty or not.
func bytea(b []byte) []byte {
	if b == nil {
		return nil
	}
	c := make([]byte, len(b))
	copy(c, b)
	return c
}

// state returns the State b names, without allocating for the four the
// store writes.
func state(b []byte) idemstore.State {
	switch string(b) {
	case string(idemstore.StateInProgress):
		return idemstore.StateInProgress
	case string(idemstore.StateCompleted):
		return idemstore.StateCompleted
	case string(idemstore.StateFailed):
		return idemstore.StateFailed
	case string(idemstore.StateReleased):
		return idemstore.StateReleased
	}
	return idemstore.State(b)
}

// timestamptz decodes a binary timestamptz into t (pgsql.DecodeTimestamptz).
// It reports false, leaving t alone, for a value of the wrong size or
// outside the range.
func timestamptz(b []byte, t *time.Time) bool {
	v, ok := pgsql.DecodeTimestamptz(b)
	if ok {
		*t = v
	}
	return ok
}
