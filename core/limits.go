package idem

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemgo/idem/core/idemstore"
)

// checkPrincipal reports why p cannot be stored, or nil.
func checkPrincipal(p string) error {
	switch {
	case len(p) > idemstore.MaxPrincipalLength:
		return fmt.Errorf("principal is %d bytes, longer than %d", len(p), idemstore.MaxPrincipalLength)
	case !utf8.ValidString(p):
		return fmt.Errorf("principal is not valid UTF-8")
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("principal contains a NUL byte")
	}
	return nil
}
