package memstore

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/http"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemstore"
)

// An entry is a record as the store keeps it: by value in the map, with its
// times as Unix nanoseconds on the store's clock and everything of variable
// length in one string. A record thus costs the garbage collector its key
// strings and one object, however many headers its response has.
//
// Against idem.Record values with deep copies this saves 6 of 9 allocations
// on claim, begin and settle, and a quarter of the instructions of a first
// request through net/http once the garbage collector is counted
// (docs/design-notes.md, "The engine's hot path").
type entry struct {
	state      idemstore.State
	uncertain  bool // idem.Record.Uncertain
	created    int64
	locked     int64
	leaseUntil int64 // idem.Record.LeaseExpiresAt
	expires    int64
	// data is the fingerprint, the lease token, the request id and the
	// nonce, then, once the record is settled, the response. Every length
	// and count is a uvarint:
	//
	//	len fingerprint  len token  len request-id  len nonce
	//	[status  headers  values  {len name  count {len value}}  body]
	//
	// headers is the number of header names and values the number of
	// values under all of them; the body runs to the end.
	data string
}

// newEntry returns the in-progress entry for a claim made at now, with
// nonce: the request's for a new record, the old record's for a takeover.
func newEntry(req *idemstore.ClaimRequest, nonce string, created, now int64) entry {
	var e encoder
	e.Grow(fieldLen(len(req.Fingerprint)) + fieldLen(len(req.Token)) + fieldLen(len(req.RequestID)) + fieldLen(len(nonce)))
	e.uvarint(uint64(len(req.Fingerprint)))
	e.Write(req.Fingerprint)
	e.str(req.Token)
	e.str(req.RequestID)
	e.str(nonce)
	return entry{
		state: idemstore.StateInProgress, created: created, locked: now, leaseUntil: addSaturating(now, req.Lease),
		expires: addSaturating(now, req.Retention), data: e.String(),
	}
}

// settle stores state and resp in e, copying resp.
func (e *entry) settle(state idemstore.State, resp *idem.Response) {
	_, _, _, _, rest := e.fields()
	ids := e.data[:len(e.data)-len(rest.s)]
	size := len(ids) + uvarintLen(uint64(resp.Status)) + uvarintLen(uint64(len(resp.Header))) + len(resp.Body)
	values := 0
	for name, vs := range resp.Header {
		size += fieldLen(len(name)) + uvarintLen(uint64(len(vs)))
		for _, v := range vs {
			size += fieldLen(len(v))
		}
		values += len(vs)
	}
	size += uvarintLen(uint64(values))

	var enc encoder
	enc.Grow(size)
	enc.WriteString(ids)
	enc.uvarint(uint64(resp.Status))
	enc.uvarint(uint64(len(resp.Header)))
	enc.uvarint(uint64(values))
	for name, vs := range resp.Header {
		enc.str(name)
		enc.uvarint(uint64(len(vs)))
		for _, v := range vs {
			enc.str(v)
		}
	}
	enc.Write(resp.Body)
	e.state, e.uncertain, e.data = state, false, enc.String()
}

// fields returns the fingerprint, lease token, request id and nonce in
// e.data and a decoder positioned after them, on the response if there is
// one.
func (e *entry) fields() (fp, token, requestID, nonce string, rest decoder) {
	rest = decoder{e.data}
	fp = rest.str()
	token = rest.str()
	requestID = rest.str()
	nonce = rest.str()
	return fp, token, requestID, nonce, rest
}

func (e *entry) fingerprint() string {
	fp, _, _, _, _ := e.fields()
	return fp
}

func (e *entry) token() string {
	_, token, _, _, _ := e.fields()
	return token
}

func (e *entry) nonce() string {
	_, _, _, nonce, _ := e.fields()
	return nonce
}

// record returns the record e holds for k, to be the caller's own. All of
// its strings share e.data, which nobody changes. Its fingerprint and body
// are copied into one allocation; the header values share one backing array,
// each header's slice capped so that an append cannot reach the next.
func (e *entry) record(k recordKey) idem.Record {
	rec := e.meta(k)
	fp, token, requestID, nonce, d := e.fields()
	rec.LeaseToken, rec.RequestID, rec.Nonce = token, requestID, nonce
	if len(d.s) == 0 {
		rec.Fingerprint = []byte(fp)
		return rec
	}

	status := int(d.uvarint())
	headers := d.uvarint()
	h := make(http.Header, headers)
	values := make([]string, d.uvarint())
	for range headers {
		name := d.str()
		n := d.uvarint()
		vs := values[:n:n]
		values = values[n:]
		for i := range vs {
			vs[i] = d.str()
		}
		h[name] = vs
	}
	buf := make([]byte, len(fp)+len(d.s))
	copy(buf, fp)
	copy(buf[len(fp):], d.s)
	rec.Fingerprint = buf[:len(fp):len(fp)]
	var body []byte
	if len(d.s) > 0 {
		body = buf[len(fp):]
	}
	rec.Response = &idem.Response{Status: status, Header: h, Body: body}
	return rec
}

// meta returns the record e holds for k without its fingerprint, lease
// token, request id, nonce and response.
func (e *entry) meta(k recordKey) idem.Record {
	return idem.Record{
		Principal: k.principal, Key: k.key, State: e.state, Uncertain: e.uncertain,
		CreatedAt: time.Unix(0, e.created), LockedAt: time.Unix(0, e.locked),
		LeaseExpiresAt: time.Unix(0, e.leaseUntil), ExpiresAt: time.Unix(0, e.expires),
	}
}

// An encoder writes entry.data. The caller grows it to the exact size
// first, so that the string is allocated once.
type encoder struct{ strings.Builder }

func (e *encoder) uvarint(x uint64) {
	var b [binary.MaxVarintLen64]byte
	e.Write(b[:binary.PutUvarint(b[:], x)])
}

func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	e.WriteString(s)
}

// A decoder reads entry.data, which the store wrote itself.
type decoder struct{ s string }

func (d *decoder) uvarint() uint64 {
	var x uint64
	for shift := 0; ; shift += 7 {
		b := d.s[0]
		d.s = d.s[1:]
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x
		}
	}
}

func (d *decoder) str() string {
	n := d.uvarint()
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}

// uvarintLen returns the length of x encoded as a uvarint.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// fieldLen returns the encoded length of a length-prefixed field of n bytes.
func fieldLen(n int) int { return uvarintLen(uint64(n)) + n }

// addSaturating returns t+d, or the nearest int64 when that overflows.
func addSaturating(t int64, d time.Duration) int64 {
	switch s := t + int64(d); {
	case d > 0 && s < t:
		return math.MaxInt64
	case d < 0 && s > t:
		return math.MinInt64
	default:
		return s
	}
}
