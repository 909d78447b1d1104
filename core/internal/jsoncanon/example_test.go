package jsoncanon_test

import (
	"fmt"

	"github.com/idemgo/idem/core/internal/jsoncanon"
)

// Example canonicalises a body the way the fingerprint sees it: members
// sorted, white space dropped, numbers in their shortest form, and the
// listed paths left out.
func Example() {
	out, err := jsoncanon.Append(nil, []byte(`{ "b": 1.50, "a": [true, null], "meta": {"sent_at": "x", "v": 2} }`),
		jsoncanon.SplitPaths([]string{"meta.sent_at"}))
	fmt.Println(string(out), err)
	// Output: {"a":[true,null],"b":1.5,"meta":{"v":2}} <nil>
}
