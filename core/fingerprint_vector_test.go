package idem_test

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/idemgo/idem/core/idemadapter"
)

// TestFingerprintVectors pins the stored fingerprint bytes: a store keeps
// them for the record's lifetime, so a change to how they are computed
// must not change them (a retry across an upgrade would get 422). The
// vectors were computed with hand-prepared HMAC pads, independently of
// the pooled crypto/hmac states the code uses, for keys shorter than,
// as long as and longer than a SHA-256 block, raw and JSON bodies, a body
// longer than a block and an ignore path.
func TestFingerprintVectors(t *testing.T) {
	t.Parallel()
	key32 := []byte("0123456789abcdef0123456789abcdef")
	key64 := bytes.Repeat([]byte{0xa5}, 64)
	key100 := bytes.Repeat([]byte("key!"), 25)
	long := `{"items":[` + string(bytes.Repeat([]byte(`{"sku":"x","n":2},`), 10)) + `{"sku":"y","n":1.50}],"note":"two of these please"}`
	tests := []struct {
		name, ct, body string
		key            []byte
		ignore         []string
		want           string
	}{
		{"raw", "application/octet-stream", "amount=1250&cvv=737", key32, nil, "02772be7437a47edf5843a310a551ec1d2f1b6e8c613bb6702c3cd7719905099ab"},
		{"JSON", "application/json", `{"currency":"EUR", "amount":1000}`, key32, nil, "02ac88744f68b7add9d62cdd5d5d4275b935e128f91b54fc4f5ca560fdc930d54e"},
		{"JSON ignored field", "application/json; charset=utf-8", `{"amount":1,"meta":{"sent_at":5}}`, key32, []string{"meta.sent_at"}, "021bebbed2602172d558195e7ee51cd0e1d6e5f4e0adb701b0d9e1f196be97a944"},
		{"invalid JSON enters raw", "application/json", `{"amount":`, key32, nil, "021d403b7bf3316393179f898e6a30a3913d78e695aaab9bf4661705ad16d0a183"},
		{"empty body", "", "", key32, nil, "027096b2ee3f892bd15dfa9659417d1b7fca2d3d89b7dd7471db9b6067e1260428"},
		{"long JSON body", "application/json", long, key32, nil, "02973eb566d70e70caa9d2cc68b99f69735e47785f1e4de65d0c4fdb59d07be1d8"},
		{"block-sized key", "application/json", `{"amount":1000}`, key64, nil, "02082e6529e9f66c3bc0d3dcbd1b8eebdf07ba7a840c6e7ff914fc51d094659725"},
		{"long key", "application/json", `{"amount":1000}`, key100, nil, "02f3db3d5215967e53de331abf62531fad0128384f01cb623b45c430b002744fef"},
	}
	for _, tc := range tests {
		got := idemadapter.Fingerprint(tc.key, "POST", "/payments?x=1", "acct_1", tc.ct, []byte(tc.body), tc.ignore)
		if hex.EncodeToString(got) != tc.want {
			t.Errorf("%s: fingerprint %x, want %s", tc.name, got, tc.want)
		}
	}
}
