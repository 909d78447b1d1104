package idem

// TEMPORARY COMPATIBILITY. The names below moved to package idemstore (what
// stores implement) and package idemadapter (what adapters call); these
// aliases keep code that still writes idem.<Name> compiling while it is
// moved over (bash rename-contract.sh DIR... rewrites it). They go away
// before a release: use the new packages.
//
// Not aliased, because idemadapter imports idem: Adapter, NewAdapter,
// ResponseBuffer, NewResponseBuffer, and the methods Engine.HandleHTTP and
// Engine.HTTPRequest, which are now idemadapter.HandleHTTP(eng, ...) and
// idemadapter.HTTPRequest(eng, ...).

import (
	"context"
	"io"
	"net/http"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/idemgo/idem/core/internal/hooks"
	"github.com/idemgo/idem/core/internal/wire"
)

// Deprecated: moved to package idemstore.
type (
	Store        = idemstore.Store
	Tx           = idemstore.Tx
	Syncer       = idemstore.Syncer
	Checker      = idemstore.Checker
	State        = idemstore.State
	Lease        = idemstore.Lease
	ClaimRequest = idemstore.ClaimRequest
	ClaimResult  = idemstore.ClaimResult
	Outcome      = idemstore.Outcome
	Stats        = idemstore.Stats
	Count        = idemstore.Count
	ErrorClass   = idemstore.ErrorClass
)

// Deprecated: moved to package idemstore.
const (
	StateInProgress    = idemstore.StateInProgress
	StateCompleted     = idemstore.StateCompleted
	StateFailed        = idemstore.StateFailed
	StateReleased      = idemstore.StateReleased
	NotCounted         = idemstore.NotCounted
	ClassOther         = idemstore.ClassOther
	ClassTransient     = idemstore.ClassTransient
	ClassMisconfigured = idemstore.ClassMisconfigured
	MaxPrincipalLength = idemstore.MaxPrincipalLength
	MaxKeyLengthLimit  = idemstore.MaxKeyLengthLimit
	MaxRequestIDLength = idemstore.MaxRequestIDLength
	FingerprintSize    = idemstore.FingerprintSize
)

// Deprecated: moved to package idemstore.
var (
	WrapStoreError    = idemstore.WrapStoreError
	EncodeHeader      = idemstore.EncodeHeader
	DecodeHeader      = idemstore.DecodeHeader
	BoundRequestID    = idemstore.BoundRequestID
	ErrHeaderEncoding = idemstore.ErrHeaderEncoding
	ErrLeaseLost      = idemstore.ErrLeaseLost
	ErrNotFound       = idemstore.ErrNotFound
	ErrTxEnded        = idemstore.ErrTxEnded
	ErrTransient      = idemstore.ErrTransient
)

// Deprecated: moved to package idemadapter.
const FingerprintVersion = hooks.FingerprintVersion

// Deprecated: moved to package idemadapter.
var (
	ErrStreaming    = wire.ErrStreaming
	ErrBodyTooLarge = wire.ErrBodyTooLarge
)

// Deprecated: moved to package idemadapter.
func WriteResponse(w http.ResponseWriter, resp *Response) { wire.WriteResponse(w, resp) }

// Deprecated: moved to package idemadapter.
func KeyField(lines []string) string { return wire.KeyField(lines) }

// Deprecated: moved to package idemadapter.
func ValidHeaderField(name string, values []string) bool { return wire.ValidHeaderField(name, values) }

// Deprecated: moved to package idemadapter.
func ValidHeaderFieldName(name string) bool { return wire.ValidHeaderFieldName(name) }

// Deprecated: moved to package idemadapter.
func ValidHeaderFieldValue(value string) bool { return wire.ValidHeaderFieldValue(value) }

// Deprecated: moved to package idemadapter.
func ReadBody(r io.Reader, limit int64) ([]byte, error) { return wire.ReadBody(r, limit) }

// Deprecated: moved to package idemadapter.
func Fingerprint(key []byte, method, path, principal, contentType string, body []byte, ignore []string) []byte {
	return fingerprintOf(key, method, path, principal, contentType, body, ignore)
}

// Deprecated: moved to package idemadapter.
func LeaseFrom(ctx context.Context) (idemstore.Lease, bool) { return leaseFrom(ctx) }
