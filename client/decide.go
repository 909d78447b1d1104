package idemclient

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ReplayedHeader is the response header by which idem (and Stripe) say
// that the response is a stored one, replayed to a retry: "true".
const ReplayedHeader = "Idempotent-Replayed"

// idem's problem types (docs/problems.md) that a retry decision reads.
// They are spelled out here so that the client needs nothing but the
// standard library.
const (
	problemBase             = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"
	problemKeyInUse         = problemBase + "key-in-use"
	problemLeaseLost        = problemBase + "lease-lost"
	problemBodyUnreadable   = problemBase + "body-unreadable"
	problemMisconfigured    = problemBase + "store-misconfigured"
	problemResponseTooLarge = problemBase + "response-too-large"
)

// outcomeUnknownSuffix ends the type of a problem that says the server does
// not know whether the operation took effect (idem's is
// problemBase + "outcome-unknown").
const outcomeUnknownSuffix = "outcome-unknown"

// ErrOutcomeUnknown is the error of a request whose answer was a problem
// of a type ending in "outcome-unknown" (idem answers it with 409 and no
// Retry-After): the server does not know whether the operation took
// effect, because an attempt's work may have been done without its result
// being recorded. The Transport does not retry it, whatever its status or
// Retry-After, and the caller should not either, with the same key or a
// new one: the answer will not change by itself, and a new key could do
// the operation twice. Keep the key (Error.Key) with the order and have an
// operator resolve the key's record on the server against the downstream
// system (idemctl show PRINCIPAL KEY finds it); after that, a retry with
// the same key (WithKey) gets what the resolution left. The answer's body
// is closed; errors.Is finds ErrOutcomeUnknown through http.Client's
// *url.Error and the *Error around it.
var ErrOutcomeUnknown = errors.New("idemclient: the server does not know whether the operation took effect")

// peekLimit bounds the bytes of a problem body read to learn its type.
const peekLimit = 16 << 10

// classifyResponse decides whether resp is the request's answer, a reason
// to try again, or an error to return instead of it. The rules, in order:
//
//   - A problem whose type ends in "outcome-unknown", at any 4xx or 5xx
//     status, is ErrOutcomeUnknown: final, and returned as an error so
//     that no caller takes it for an answer to retry.
//   - A replay (Idempotent-Replayed: true) is the server's settled answer
//     for the key: never retried, whatever its status.
//   - 409 Conflict is retried: idem's key-in-use and lease-lost, and a 409
//     that is not one of idem's problem types, which is how Stripe and the
//     IETF draft say that an attempt with the key is still running. Other
//     idem 409 types are not.
//   - 429, 502, 503 and 504 are retried.
//   - 500 is retried unless its idem problem type says that retrying
//     cannot help (store-misconfigured, response-too-large);
//     transaction-ended and commit-failed are retried.
//   - 400 is retried only as idem's body-unreadable (the server did not get
//     the whole body, and stored nothing). 422 (the key reused with another
//     request) and every other status are final.
//
// To read a problem type, classifyResponse reads at most peekLimit bytes of
// an application/problem+json body and puts them back in front of the
// rest, so the caller still reads the whole body.
func classifyResponse(resp *http.Response) (retry bool, err error) {
	var typ string
	if resp.StatusCode >= 400 {
		if typ = problemType(resp); strings.HasSuffix(typ, outcomeUnknownSuffix) {
			return false, ErrOutcomeUnknown
		}
	}
	if isReplayed(resp) {
		return false, nil
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		if strings.HasPrefix(typ, problemBase) && typ != problemKeyInUse && typ != problemLeaseLost {
			return false, nil
		}
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	case http.StatusInternalServerError:
		switch typ {
		case problemMisconfigured, problemResponseTooLarge:
			return false, nil
		}
	case http.StatusBadRequest:
		if typ != problemBodyUnreadable {
			return false, nil
		}
	default:
		return false, nil
	}
	return true, nil
}

// retryableError reports whether an attempt that failed with err (no
// response) may be tried again: every transport error except those that
// the next attempt would meet again (a certificate that does not verify,
// a TLS handshake with a plain HTTP server, a host that does not exist).
// The request context's end is checked by the loop.
func retryableError(err error) bool {
	var (
		certErr  *tls.CertificateVerificationError
		recErr   tls.RecordHeaderError
		authErr  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalErr x509.CertificateInvalidError
		dnsErr   *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &authErr),
		errors.As(err, &hostErr), errors.As(err, &invalErr):
		return false
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return false
	}
	return true
}

// isReplayed reports whether resp says it is a replayed stored response.
func isReplayed(resp *http.Response) bool {
	return strings.EqualFold(strings.TrimSpace(resp.Header.Get(ReplayedHeader)), "true")
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (RFC 9110 §10.2.3). A date in the past is zero. ok is false when v is
// absent or neither form.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if ne, isNum := err.(*strconv.NumError); isNum && ne.Err == strconv.ErrRange {
				return math.MaxInt64, true
			}
			return 0, false
		}
		if n > uint64(math.MaxInt64/int64(time.Second)) {
			return math.MaxInt64, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// problemType returns the "type" of resp's body when it is an RFC 9457
// application/problem+json document, or "". It reads at most peekLimit
// bytes and leaves resp.Body whole for the next reader.
func problemType(resp *http.Response) string {
	ct := resp.Header.Get("Content-Type")
	if ct == "" || resp.Body == nil || resp.Body == http.NoBody {
		return ""
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/problem+json" {
		return ""
	}
	peek, _ := io.ReadAll(io.LimitReader(resp.Body, peekLimit))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(peek), resp.Body), resp.Body}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(peek, &p) != nil {
		return ""
	}
	return p.Type
}
