package idemstore

import "fmt"

// ErrorClass is what a store's error means for the request: whether
// retrying can help. Stores classify their driver's errors and wrap them
// with WrapStoreError, so that every store wraps the same way.
type ErrorClass int

const (
	// ClassOther is an error that is neither transient nor a
	// misconfiguration.
	ClassOther ErrorClass = iota
	// ClassTransient is an error a retry can get past (ErrTransient).
	ClassTransient
	// ClassMisconfigured is an error no retry fixes (ErrMisconfigured).
	ClassMisconfigured
)

// WrapStoreError returns err wrapped once with the store's package name
// and the operation, "idempgx: claim: …", and with ErrTransient or
// ErrMisconfigured according to class, so that errors.Is reaches both the
// sentinel and the driver's own error. It returns nil for a nil err.
func WrapStoreError(pkg, op string, class ErrorClass, err error) error {
	if err == nil {
		return nil
	}
	switch class {
	case ClassTransient:
		return fmt.Errorf("%s: %s: %w: %w", pkg, op, ErrTransient, err)
	case ClassMisconfigured:
		return fmt.Errorf("%s: %s: %w: %w", pkg, op, ErrMisconfigured, err)
	}
	return fmt.Errorf("%s: %s: %w", pkg, op, err)
}
