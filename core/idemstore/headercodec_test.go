package idemstore

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
)

func TestHeaderCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
	}{
		{"empty", http.Header{}},
		{"typical", http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/1"}}},
		{"NUL and invalid UTF-8", http.Header{"X-Odd": {"a\x00b", "\xff\xfe", ""}}},
		{"no values", http.Header{"X-Empty": {}}},
		{"many values", http.Header{"Cache-Control": {"no-store", "private", "max-age=0"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeHeader(EncodeHeader(tc.h))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.h) {
				t.Fatalf("round trip: got %q, want %q", got, tc.h)
			}
		})
	}
}

func TestHeaderCodecIsDeterministic(t *testing.T) {
	h := http.Header{"B": {"2"}, "A": {"1"}, "C": {"3"}}
	first := EncodeHeader(h)
	for range 20 {
		if !bytes.Equal(EncodeHeader(h), first) {
			t.Fatal("EncodeHeader depends on map order")
		}
	}
}

func TestDecodeHeaderRejects(t *testing.T) {
	valid := EncodeHeader(http.Header{"A": {"b"}})
	tests := map[string][]byte{
		"unknown version":  {9, 0},
		"truncated":        valid[:len(valid)-1],
		"trailing bytes":   append(append([]byte{}, valid...), 0),
		"count too large":  {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"length too large": {1, 1, 0x7f, 'a'},
		"duplicate name":   {1, 2, 1, 'a', 0, 1, 'a', 0},
		"bad varint":       {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeHeader(b); !errors.Is(err, ErrHeaderEncoding) {
				t.Fatalf("DecodeHeader(%x) = %v, want ErrHeaderEncoding", b, err)
			}
		})
	}
}

func FuzzHeaderCodec(f *testing.F) {
	f.Add(EncodeHeader(http.Header{"Content-Type": {"application/json"}}))
	f.Add([]byte{1, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		again, err := DecodeHeader(EncodeHeader(h))
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Fatalf("re-encoding %q: %v, %q", h, err, again)
		}
	})
}
