package adaptertest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/storetest"
)

// Response is what a client got back from one round trip made with Send or
// SendContext.
type Response struct {
	Status int         // the status received
	Header http.Header // the headers received
	Body   []byte      // the whole body received
	// Close reports that the server closes the connection after this
	// response (http.Response.Close).
	Close bool
}

// ProblemType returns the "type" member of a problem+json body, or "" when
// the body is not such a document.
func (r Response) ProblemType() string {
	var p struct{ Type string }
	_ = json.Unmarshal(r.Body, &p)
	return p.Type
}

// Replayed reports whether the response carries the replay marker
// (idem.ReplayedHeader: true).
func (r Response) Replayed() bool { return r.Header.Get(idem.ReplayedHeader) == "true" }

// client bounds each round trip, so a server that never answers fails the
// test instead of hanging it.
var client = &http.Client{Timeout: 20 * time.Second}

// Send makes one request with a JSON body, as principal ("Authorization:
// Bearer <principal>", none when "") with Idempotency-Key key (none when
// ""), plus extra headers given as name, value pairs. It ends the test when
// the round trip fails.
func Send(t testing.TB, method, url, principal, key, body string, extra ...string) Response {
	t.Helper()
	r, err := SendContext(context.Background(), method, url, principal, key, body, extra...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

// SendContext is Send with a context, returning the round trip's error
// instead of ending the test; use it from goroutines other than the test's.
func SendContext(ctx context.Context, method, url, principal, key, body string, extra ...string) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if principal != "" {
		req.Header.Set("Authorization", "Bearer "+principal)
	}
	if key != "" {
		req.Header.Set(idem.DefaultHeader, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	return roundTrip(req)
}

// roundTrip sends req and reads the whole response.
func roundTrip(req *http.Request) (Response, error) {
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: b, Close: resp.Close}, nil
}

// WantStatus ends the test unless r has the status; what names the request
// in the message.
func WantStatus(t testing.TB, what string, r Response, status int) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: status %d, want %d; body %q", what, r.Status, status, r.Body)
	}
}

// WantProblem ends the test unless r is a problem+json document of the
// status and problem type.
func WantProblem(t testing.TB, what string, r Response, status int, typ idem.ProblemType) {
	t.Helper()
	WantStatus(t, what, r, status)
	if ct := r.Header.Get("Content-Type"); ct != idem.ProblemContentType {
		t.Fatalf("%s: Content-Type %q, want %s", what, ct, idem.ProblemContentType)
	}
	if got := r.ProblemType(); got != string(typ) {
		t.Fatalf("%s: problem type %q, want %q", what, got, typ)
	}
}

// Effects returns how many business effects b has committed under id,
// ending the test when b cannot count them.
func Effects(t testing.TB, b storetest.Backend, id string) int {
	t.Helper()
	n, err := b.CountEffects(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
