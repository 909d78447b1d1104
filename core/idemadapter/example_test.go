package idemadapter_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/idemadapter"
	"github.com/idemgo/idem/core/memstore"
	"github.com/idemgo/idem/core/storetest"
)

// An adapter for a framework built on net/http runs each request through
// HandleHTTP: the handler runs once, and the retry gets the stored answer.
func ExampleHandleHTTP() {
	eng, err := idem.New(idem.Config{Store: memstore.MustNew(), FingerprintKey: storetest.FingerprintKey, AllowTxUnused: true})
	if err != nil {
		panic(err)
	}
	handler := func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"pay_1"}`)
	}
	// The adapter's middleware: the principal comes from the application's
	// authentication, here a header.
	mw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idemadapter.HandleHTTP(eng, w, r, r.Header.Get("X-Principal"), func(r2 *http.Request, buf *idemadapter.ResponseBuffer) error {
			if buf == nil { // the key is optional and absent
				handler(w, r2)
				return nil
			}
			handler(buf, r2)
			return nil
		})
	})
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1000}`))
		r.Header.Set("X-Principal", "acct_1")
		r.Header.Set(idem.DefaultHeader, "order-42")
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get(idem.ReplayedHeader))
	}
	// Output:
	// 201 {"id":"pay_1"} replayed=""
	// 201 {"id":"pay_1"} replayed="true"
}
