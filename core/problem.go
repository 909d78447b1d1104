package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The problem responses' media type and type URIs.
const (
	// ProblemContentType is the media type of problem responses.
	ProblemContentType = "application/problem+json"
	// ProblemTypeBase prefixes every problem type URI the library
	// produces.
	ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"
)

// ProblemType names one kind of error response. The values are stable: clients
// may branch on them.
type ProblemType string

// The problem types the library produces, one per case.
const (
	ProblemKeyMissing       ProblemType = ProblemTypeBase + "key-missing"
	ProblemKeyInvalid       ProblemType = ProblemTypeBase + "key-invalid"
	ProblemKeyInUse         ProblemType = ProblemTypeBase + "key-in-use"
	ProblemKeyReused        ProblemType = ProblemTypeBase + "key-reused"
	ProblemBodyTooLarge     ProblemType = ProblemTypeBase + "body-too-large"
	ProblemBodyUnreadable   ProblemType = ProblemTypeBase + "body-unreadable"
	ProblemUnauthenticated  ProblemType = ProblemTypeBase + "unauthenticated"
	ProblemForbidden        ProblemType = ProblemTypeBase + "replay-forbidden"
	ProblemResponseTooLarge ProblemType = ProblemTypeBase + "response-too-large"
	ProblemLeaseLost        ProblemType = ProblemTypeBase + "lease-lost"
	ProblemStoreUnavailable ProblemType = ProblemTypeBase + "store-unavailable"
	ProblemCommitFailed     ProblemType = ProblemTypeBase + "commit-failed"
	ProblemTimeout          ProblemType = ProblemTypeBase + "timeout"
	ProblemTxEnded          ProblemType = ProblemTypeBase + "transaction-ended"
	ProblemMisconfigured    ProblemType = ProblemTypeBase + "store-misconfigured"
	ProblemPrincipalInvalid ProblemType = ProblemTypeBase + "principal-invalid"
	ProblemResponseInvalid  ProblemType = ProblemTypeBase + "response-invalid"
	ProblemTooManyInFlight  ProblemType = ProblemTypeBase + "too-many-in-flight"
	ProblemReplayUnreadable ProblemType = ProblemTypeBase + "replay-unreadable"
	ProblemOutcomeUnknown   ProblemType = ProblemTypeBase + "outcome-unknown"
	ProblemTxOwned          ProblemType = ProblemTypeBase + "transaction-owned"
)

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   ProblemType `json:"type"`
	Title  string      `json:"title"`
	Status int         `json:"status"`
	Detail string      `json:"detail,omitempty"`
}

// Response renders p as an HTTP response. retryAfter > 0 adds a Retry-After
// header in whole seconds.
func (p Problem) Response(retryAfter int) *Response {
	body, _ := json.Marshal(p) // only strings and ints: cannot fail
	h := http.Header{"Content-Type": {ProblemContentType}, "Cache-Control": {"no-store"}}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	return &Response{Status: p.Status, Header: h, Body: body}
}

var problems = map[ProblemType]Problem{
	ProblemKeyMissing: {Status: http.StatusBadRequest, Title: "Idempotency key missing",
		Detail: "This operation requires an Idempotency-Key header."},
	ProblemKeyInvalid: {Status: http.StatusBadRequest, Title: "Idempotency key invalid",
		Detail: "The Idempotency-Key header must be one field line holding 1 to 255 visible ASCII characters, bare or as a quoted string; a key with a comma or semicolon must be quoted."},
	ProblemKeyInUse: {Status: http.StatusConflict, Title: "Idempotency key in use",
		Detail: "A request with this idempotency key is still being processed. Retry after the time in Retry-After."},
	ProblemKeyReused: {Status: http.StatusUnprocessableEntity, Title: "Idempotency key reused",
		Detail: "This idempotency key was used with a different request. Use a new key for a new request."},
	ProblemBodyTooLarge: {Status: http.StatusRequestEntityTooLarge, Title: "Request body too large",
		Detail: "The request body is larger than this endpoint accepts."},
	ProblemBodyUnreadable: {Status: http.StatusBadRequest, Title: "Request body unreadable",
		Detail: "The request body could not be read to the end. Nothing was stored; retrying is safe."},
	ProblemUnauthenticated: {Status: http.StatusUnauthorized, Title: "Not authenticated",
		Detail: "Idempotent requests must be authenticated."},
	ProblemForbidden: {Status: http.StatusForbidden, Title: "Replay not authorised",
		Detail: "You are no longer authorised to see the result of this request."},
	ProblemResponseTooLarge: {Status: http.StatusInternalServerError, Title: "Response too large",
		Detail: "The response was too large to store, so the request was rolled back. Retrying is safe."},
	ProblemResponseInvalid: {Status: http.StatusInternalServerError, Title: "Response invalid",
		Detail: "The response carried a header that is not valid HTTP, so it was not stored and the request was rolled back. Retrying is safe."},
	ProblemLeaseLost: {Status: http.StatusConflict, Title: "Idempotency key taken over",
		Detail: "This request ran longer than its lease and another attempt took the key over. Nothing was stored; retry to get that attempt's result."},
	ProblemStoreUnavailable: {Status: http.StatusServiceUnavailable, Title: "Idempotency store unavailable",
		Detail: "The idempotency store could not be reached. Nothing was stored; retrying is safe."},
	ProblemCommitFailed: {Status: http.StatusInternalServerError, Title: "Commit failed",
		Detail: "The commit failed or its answer was lost, so whether the request took effect is not known here. Retry with the same key to learn it: the retry replays the stored response if the commit landed, and runs the request again if it did not."},
	ProblemTimeout: {Status: http.StatusServiceUnavailable, Title: "Request timed out",
		Detail: "The request did not finish within its deadline and was rolled back. Retrying is safe."},
	ProblemTxEnded: {Status: http.StatusInternalServerError, Title: "Transaction ended by the handler",
		Detail: "The handler ended the request's transaction itself, so part of its work may have been committed without its stored response. " +
			"The key is kept until it is reconciled or an operator resolves it; it is not run again."},
	ProblemMisconfigured: {Status: http.StatusInternalServerError, Title: "Idempotency store misconfigured",
		Detail: "The idempotency store is not set up correctly (a missing table, column or permission). Nothing was stored; retrying will not help until it is fixed."},
	ProblemTxOwned: {Status: http.StatusInternalServerError, Title: "Handler ended the transaction",
		Detail: "The handler tried to commit or roll back the request's transaction, which the idempotency store owns. Nothing was stored and everything was rolled back. " +
			"This is a bug in the handler: a retry fails the same way until it is fixed."},
	ProblemOutcomeUnknown: {Status: http.StatusConflict, Title: "Outcome unknown",
		Detail: "An earlier attempt with this idempotency key may have taken effect without its result being stored, so the request is not run again. " +
			"Retrying will not help until an operator resolves the key; do not retry with a new key before checking whether the first attempt took effect."},
	ProblemReplayUnreadable: {Status: http.StatusInternalServerError, Title: "Stored response unreadable",
		Detail: "The stored response to this request could not be decrypted, so it is not replayed. The request was not run again; retrying will not help until the server's key is restored."},
	ProblemTooManyInFlight: {Status: http.StatusTooManyRequests, Title: "Too many requests in flight",
		Detail: "Too many of your idempotent requests are being processed at once. Nothing was stored; retry after the time in Retry-After."},
	ProblemPrincipalInvalid: {Status: http.StatusBadRequest, Title: "Principal cannot be stored",
		Detail: "The authenticated principal is empty, too long or not valid UTF-8, so an idempotent request cannot be recorded for it."},
}

// NewProblem returns the standard problem for t. It panics on an unknown type,
// which only a programming error can produce.
func NewProblem(t ProblemType) Problem {
	p, ok := problems[t]
	if !ok {
		panic("idem: unknown problem type " + string(t))
	}
	p.Type = t
	return p
}
