package dsn_test

import (
	"errors"
	"fmt"

	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
)

// Parse recognises the store by the DSN's shape, hands the driver its own
// form, and keeps the password out of what it shows.
func Example() {
	for _, raw := range []string{
		"postgres://ops:s3cret@db.internal:5432/payments",
		"app:s3cret@tcp(127.0.0.1:3306)/payments?parseTime=true",
		"redis://:s3cret@127.0.0.1:6379/0",
	} {
		d, err := dsn.Parse(raw, "")
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(d.Kind, d.Redacted)
	}
	d, _ := dsn.Parse("postgres://ops:s3cret@db.internal:5432/payments", "")
	fmt.Println(d.Scrub(errors.New("dial postgres://ops:s3cret@db.internal:5432: refused")))
	// Output:
	// postgres postgres://ops:xxxxx@db.internal:5432/payments
	// mysql app:xxxxx@tcp(127.0.0.1:3306)/payments?parseTime=true
	// redis redis://:xxxxx@127.0.0.1:6379/0
	// dial postgres://ops:xxxxx@db.internal:5432: refused
}
