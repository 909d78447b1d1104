package idemstore

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
)

// EncodeHeader encodes h for a store, byte-exact: names and values are kept
// as they are, whatever bytes they contain (NUL, invalid UTF-8), which a
// JSON column cannot promise. DecodeHeader reverses it. The format is a
// version byte, then the number of names and, for each name in sorted
// order, the name, the number of values and the values, every length and
// count an unsigned varint. Stores that keep headers in a binary column
// use it so that every store replays the same bytes.
func EncodeHeader(h http.Header) []byte {
	names := make([]string, 0, len(h))
	size := 1 + binary.MaxVarintLen64
	for name, vals := range h {
		names = append(names, name)
		size += len(name) + 2*binary.MaxVarintLen64
		for _, v := range vals {
			size += len(v) + binary.MaxVarintLen64
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerCodecVersion)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		vals := h[name]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendString(b, v)
		}
	}
	return b
}

const headerCodecVersion = 1

// ErrHeaderEncoding is returned by DecodeHeader for bytes EncodeHeader did
// not produce.
var ErrHeaderEncoding = errors.New("idem: stored headers are not in EncodeHeader's format")

// DecodeHeader decodes what EncodeHeader encoded. It never panics and
// never allocates more than its input can hold: a count or length that
// exceeds the bytes left is an error wrapping ErrHeaderEncoding. Empty
// input decodes to an empty header.
func DecodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return http.Header{}, nil
	}
	if b[0] != headerCodecVersion {
		return nil, ErrHeaderEncoding
	}
	d := headerDecoder{b: b[1:], ok: true}
	n := d.count(2) // a name is at least a length and a value count
	h := make(http.Header, n)
	for i := uint64(0); i < n && d.ok; i++ {
		name := d.str()
		nv := d.count(1)
		vals := make([]string, 0, nv)
		for j := uint64(0); j < nv && d.ok; j++ {
			vals = append(vals, d.str())
		}
		if _, dup := h[name]; dup {
			d.ok = false
		}
		h[name] = vals
	}
	if !d.ok || len(d.b) != 0 {
		return nil, ErrHeaderEncoding
	}
	return h, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

type headerDecoder struct {
	b  []byte
	ok bool
}

func (d *headerDecoder) uvarint() uint64 {
	if !d.ok {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.ok = false
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items each at least minSize bytes long, refusing
// one the remaining input cannot hold.
func (d *headerDecoder) count(minSize uint64) uint64 {
	n := d.uvarint()
	if !d.ok || n > uint64(len(d.b))/minSize {
		d.ok = false
		return 0
	}
	return n
}

func (d *headerDecoder) str() string {
	n := d.uvarint()
	if !d.ok || n > uint64(len(d.b)) {
		d.ok = false
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
