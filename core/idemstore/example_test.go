package idemstore_test

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/idemgo/idem/core/idemstore"
)

// A store wraps its driver's errors once, with its package name, the
// operation and the error's class, so that the engine recognises a
// transient failure and the driver's error stays reachable.
func ExampleWrapStoreError() {
	driverErr := errors.New("deadlock detected")
	err := idemstore.WrapStoreError("idemexample", "claim", idemstore.ClassTransient, driverErr)
	fmt.Println(err)
	fmt.Println(errors.Is(err, idemstore.ErrTransient), errors.Is(err, driverErr))
	// Output:
	// idemexample: claim: idem: transient store error: deadlock detected
	// true true
}

// A store that keeps headers in a binary column keeps them byte-exact with
// EncodeHeader, and replays what DecodeHeader gives back.
func ExampleEncodeHeader() {
	h := http.Header{"Location": {"/payments/pay_1"}, "X-Raw": {"a\x00b"}}
	b := idemstore.EncodeHeader(h)
	back, err := idemstore.DecodeHeader(b)
	fmt.Printf("%q %v\n", back["X-Raw"], err)
	// Output:
	// ["a\x00b"] <nil>
}
