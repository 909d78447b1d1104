package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// TestLogRedactsQueryAndKey: the engine's log line carries the path without
// its query string and the key only hashed unless Config.LogKeys; the Event
// keeps both whole.
func TestLogRedactsQueryAndKey(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("alice\x00secret-key-1"))
	hash := hex.EncodeToString(sum[:8])
	tests := []struct {
		name     string
		logKeys  bool
		wantKey  string // the "key" attribute, "" when absent
		wantHash string // the "key_hash" attribute, "" when absent
	}{
		{"hashed by default", false, "", hash},
		{"raw when LogKeys", true, "secret-key-1", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			var ev idem.Event
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey,
				Store: memstore.MustNew(), LogKeys: tc.logKeys,
				Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
				Observer: idem.ObserverFunc(func(_ context.Context, got idem.Event) { ev = got }),
			})
			if err != nil {
				t.Fatal(err)
			}
			req := request("alice", "secret-key-1")
			req.Path = "/payments?card=4111111111111111"
			att, resp := e.Begin(context.Background(), req)
			if att == nil {
				t.Fatalf("no claim: %+v", resp)
			}
			att.Finish(idem.Result{Status: http.StatusCreated})
			var line map[string]any
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("log %q: %v", logs.String(), err)
			}
			if line["path"] != "/payments" || strings.Contains(logs.String(), "4111") {
				t.Errorf("log carries the query: %s", logs.String())
			}
			if got, _ := line["key"].(string); got != tc.wantKey {
				t.Errorf("key = %q, want %q", got, tc.wantKey)
			}
			if got, _ := line["key_hash"].(string); got != tc.wantHash {
				t.Errorf("key_hash = %q, want %q", got, tc.wantHash)
			}
			if !tc.logKeys && strings.Contains(logs.String(), "secret-key-1") {
				t.Errorf("raw key logged: %s", logs.String())
			}
			if ev.Path != req.Path || ev.Key != "secret-key-1" {
				t.Errorf("Event = path %q key %q, want the full data", ev.Path, ev.Key)
			}
		})
	}
}

// TestStoredHeadersRefusesSensitive: Set-Cookie, Authorization and
// Proxy-Authorization, in any case, are refused at New unless
// AllowSensitiveStoredHeaders.
func TestStoredHeadersRefusesSensitive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header  string
		allow   bool
		wantErr bool
	}{
		{"Set-Cookie", false, true},
		{"set-cookie", false, true},
		{"AUTHORIZATION", false, true},
		{"Proxy-Authorization", false, true},
		{"proxy-authorization", false, true},
		{"Set-Cookie", true, false},
		{"Authorization", true, false},
		{"Location", false, false},
		{"X-Authorization-Hint", false, false},
	}
	for _, tc := range tests {
		_, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), StoredHeaders: []string{"Content-Type", tc.header},
			AllowSensitiveStoredHeaders: tc.allow})
		switch {
		case tc.wantErr && (!errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.header)):
			t.Errorf("%s (allow %v): New = %v, want ErrInvalidConfig naming it", tc.header, tc.allow, err)
		case !tc.wantErr && err != nil:
			t.Errorf("%s (allow %v): New = %v, want nil", tc.header, tc.allow, err)
		}
	}
}

// TestBlankKeyWithKeyOptional: with KeyOptional, only an absent header
// means "no key"; a header that is present but blank or the empty string
// "" is a 400 key-invalid, never a run without deduplication.
func TestBlankKeyWithKeyOptional(t *testing.T) {
	t.Parallel()
	e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(), KeyOptional: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		header []string // the key header's values; nil: absent
		want   int      // 0: passed through without a key
	}{
		{"absent", nil, 0},
		{"empty value", []string{""}, http.StatusBadRequest},
		{"spaces", []string{"   "}, http.StatusBadRequest},
		{"tab", []string{"\t"}, http.StatusBadRequest},
		{"empty quoted string", []string{`""`}, http.StatusBadRequest},
		{"a key", []string{"k1"}, http.StatusCreated},
	}
	for _, tc := range tests {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		if tc.header != nil {
			r.Header["Idempotency-Key"] = tc.header
		}
		ran := false
		w := httptest.NewRecorder()
		idemadapter.HandleHTTP(e, w, r, "alice", func(_ *http.Request, buf *idemadapter.ResponseBuffer) error {
			ran = true
			if buf == nil { // passed through
				return nil
			}
			buf.WriteHeader(http.StatusCreated)
			return nil
		})
		got := w.Code
		if tc.want == 0 {
			if !ran || got != http.StatusOK {
				t.Errorf("%s: ran %v, status %d; want passed through", tc.name, ran, got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("%s: status %d, want %d (ran %v)", tc.name, got, tc.want, ran)
		}
		if tc.want == http.StatusBadRequest && (ran || !strings.Contains(w.Body.String(), "key-invalid")) {
			t.Errorf("%s: ran %v, body %s; want a key-invalid problem without running", tc.name, ran, w.Body)
		}
	}
	// The engine's Request: a raw blank value (a framework that keeps the
	// white space) is refused the same way.
	req := request("alice", " \t ")
	if att, resp := e.Begin(context.Background(), req); att != nil || resp == nil || resp.Status != http.StatusBadRequest {
		t.Errorf("Begin with a blank key: attempt %v, response %+v; want 400", att, resp)
	}
}

// TestStoredHeaderValuesValidated: a response whose header to be stored is
// not valid HTTP is not stored: the attempt is released and answered 500
// response-invalid. WriteResponse leaves such a header out of a replay.
func TestStoredHeaderValuesValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header http.Header
		want   int // the status sent
	}{
		{"CRLF in Location", http.Header{"Location": {"/ok\r\nSet-Cookie: x=1"}}, http.StatusInternalServerError},
		{"LF alone", http.Header{"Location": {"/ok\nX: 1"}}, http.StatusInternalServerError},
		{"CR alone", http.Header{"Content-Language": {"en\r"}}, http.StatusInternalServerError},
		{"NUL", http.Header{"Content-Type": {"text/plain\x00"}}, http.StatusInternalServerError},
		{"DEL", http.Header{"Cache-Control": {"no-store\x7f"}}, http.StatusInternalServerError},
		{"second value bad", http.Header{"Location": {"/ok", "/b\r\n"}}, http.StatusInternalServerError},
		{"invalid name", http.Header{"X Bad": {"1"}}, http.StatusInternalServerError},
		{"tab and obs-text are fine", http.Header{"Content-Language": {"en\tfr \xe9"}}, http.StatusCreated},
		{"bad header not stored is ignored", http.Header{"X-Not-Stored": {"a\r\nb"}}, http.StatusCreated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ev idem.Event
			e, err := idem.New(idem.Config{FingerprintKey: storetest.FingerprintKey, Store: memstore.MustNew(),
				StoredHeaders: append([]string{"X Bad"}, idem.DefaultStoredHeaders...),
				Observer:      idem.ObserverFunc(func(_ context.Context, got idem.Event) { ev = got })})
			if err != nil {
				t.Fatal(err)
			}
			att, resp := e.Begin(context.Background(), request("alice", "k"))
			if att == nil {
				t.Fatalf("no claim: %+v", resp)
			}
			resp = att.Finish(idem.Result{Status: http.StatusCreated, Header: tc.header, Body: []byte("ok")})
			if resp.Status != tc.want {
				t.Fatalf("status %d, want %d", resp.Status, tc.want)
			}
			again, replay := e.Begin(context.Background(), request("alice", "k"))
			if tc.want == http.StatusCreated {
				if again != nil || replay == nil || replay.Status != http.StatusCreated {
					t.Fatalf("valid response not stored: attempt %v, %+v", again, replay)
				}
				return
			}
			if !strings.Contains(string(resp.Body), "response-invalid") || ev.Outcome != idem.OutcomeResponseInvalid ||
				!errors.Is(ev.Err, idem.ErrResponseInvalid) {
				t.Errorf("answer %s, outcome %s, err %v; want response-invalid", resp.Body, ev.Outcome, ev.Err)
			}
			if again == nil {
				t.Fatalf("key not released: %+v", replay)
			}
			again.Abort()
		})
	}
}

// TestWriteResponseSkipsInvalidHeaders: a stored header that is not valid
// HTTP (a record stored before Finish checked) is left out of the replay.
func TestWriteResponseSkipsInvalidHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header http.Header
		absent string // the header that must not be written
	}{
		{"CRLF value", http.Header{"Location": {"/ok\r\nSet-Cookie: x=1"}}, "Location"},
		{"NUL value", http.Header{"Content-Type": {"a\x00"}}, "Content-Type"},
		{"bad name", http.Header{"X Bad": {"1"}}, "X Bad"},
	}
	for _, tc := range tests {
		w := httptest.NewRecorder()
		tc.header["Cache-Control"] = []string{"no-store"}
		idemadapter.WriteResponse(w, &idem.Response{Status: http.StatusCreated, Header: tc.header, Body: []byte("ok")})
		if _, ok := w.Header()[tc.absent]; ok || w.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s: written header %v; want %s left out and the rest kept", tc.name, w.Header(), tc.absent)
		}
	}
}

// TestValidHeaderField: the hand-written checks agree with
// httpguts on the bytes that matter.
func TestValidHeaderField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, value     string
		nameOK, valueOK bool
	}{
		{"Content-Type", "text/plain", true, true},
		{"X_Y.z~!#$%&'*+^`|", "a\tb", true, true},
		{"", "", false, true},
		{"A B", "\xff", false, true},
		{"A:B", "a\rb", false, false},
		{"A\x00", "a\nb", false, false},
		{"Ä", "a\x7f", false, false},
		{"(x)", "\x01", false, false},
	} {
		if got := idemadapter.ValidHeaderFieldName(tc.name); got != tc.nameOK {
			t.Errorf("ValidHeaderFieldName(%q) = %v", tc.name, got)
		}
		if got := idemadapter.ValidHeaderFieldValue(tc.value); got != tc.valueOK {
			t.Errorf("ValidHeaderFieldValue(%q) = %v", tc.value, got)
		}
	}
}
