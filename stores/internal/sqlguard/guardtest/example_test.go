package guardtest_test

import (
	"fmt"

	"github.com/idemgo/idem/stores/internal/sqlguard"
	"github.com/idemgo/idem/stores/internal/sqlguard/guardtest"
)

// A differential test sends every text of the corpus to the server and
// checks that whenever the server ended the transaction, the guard had
// refused the text.
func ExampleTexts() {
	texts := guardtest.Texts(sqlguard.PostgreSQL, 100, 11)
	refused := 0
	for _, q := range texts {
		if _, bad := sqlguard.TxControl(sqlguard.PostgreSQL, q); bad {
			refused++
		}
	}
	fmt.Println(len(texts) > 100, refused > 0)
	// Output: true true
}
