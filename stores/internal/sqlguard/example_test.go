package sqlguard_test

import (
	"fmt"

	"github.com/idemgo/idem/stores/internal/sqlguard"
)

// A store's handle asks the guard before it sends a handler's text. The
// COMMIT after a string is found, the one inside it is not; savepoint
// statements are reported for the handle to track.
func Example() {
	for _, q := range []string{
		"INSERT INTO payments VALUES ('p_1', 'COMMIT; -- not a statement')",
		"UPDATE accounts SET balance = balance - 10; COMMIT",
		"SAVEPOINT before_fee",
	} {
		if words, bad := sqlguard.TxControl(sqlguard.PostgreSQL, q); bad {
			fmt.Printf("refused: %s\n", words)
			continue
		}
		v := sqlguard.Inspect(sqlguard.PostgreSQL, q)
		fmt.Printf("runs: %d savepoint statement(s)\n", len(v.Ops))
	}
	// Output:
	// runs: 0 savepoint statement(s)
	// refused: commit
	// runs: 1 savepoint statement(s)
}

// On MySQL the guard reads a text under every sql_mode that changes
// quoting, and also refuses statements that commit implicitly.
func ExampleInspect() {
	fmt.Println(sqlguard.Inspect(sqlguard.MySQL, "CREATE TABLE t (id INT)").Refused)
	fmt.Println(sqlguard.Inspect(sqlguard.MySQL, "CREATE TEMPORARY TABLE t (id INT)").Dirty)
	// Output:
	// CREATE ends or commits the transaction
	// true
}
