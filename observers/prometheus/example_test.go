package idemprom_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	idemprom "github.com/idemgo/idem/observers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Example feeds the engine's events and the sweeper's results into a
// registry the application owns, which its /metrics handler serves
// (promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
func Example() {
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg, idemprom.Options{Routes: []string{"/payments"}})
	if err != nil {
		panic(err)
	}
	store := memstore.MustNew()
	engine, _ := idem.New(idem.Config{FingerprintKey: []byte("example only: read yours from a secret store"), Store: store, Observer: m})
	_ = &idem.Sweeper{Store: store, Lease: engine.Config().Lease, Observer: m} // go sweeper.Run(ctx)

	for range 3 { // one claim, two replays
		att, _ := engine.Begin(context.Background(), idem.Request{
			Method: "POST", Path: "/payments", Route: "/payments", Principal: "acct_1", Key: "7f3a",
			Body: strings.NewReader(`{"amount":1000}`),
		})
		if att != nil {
			att.Finish(idem.Result{Status: http.StatusCreated})
		}
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if v := s.GetCounter().GetValue(); mf.GetName() == "idem_requests_total" && v > 0 {
				fmt.Println(mf.GetName(), s.GetLabel()[0].GetValue(), s.GetLabel()[1].GetValue(), v)
			}
		}
	}
	n, _ := testutil.GatherAndCount(reg, "idem_requests_total")
	fmt.Println("series:", n)
	// Output:
	// idem_requests_total claimed /payments 1
	// idem_requests_total replayed /payments 2
	// series: 23
}
