package idemotel_test

import (
	"context"
	"fmt"
	"net/http"

	idem "github.com/idemgo/idem/core"
	"github.com/idemgo/idem/core/memstore"
	idemotel "github.com/idemgo/idem/observers/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Example records a span per request; the replay's span links to the
// span of the request whose answer it replays, because that request stored
// its traceparent as its request id.
func Example() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	o, err := idemotel.New(idemotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	if err != nil {
		panic(err)
	}
	store := memstore.MustNew()
	engine, _ := idem.New(idem.Config{FingerprintKey: []byte("example only: read yours from a secret store"), Store: store, Observer: o})
	_ = &idem.Sweeper{Store: store, Lease: engine.Config().Lease, Observer: o} // go sweeper.Run(ctx)

	for range 2 {
		ctx, server := tp.Tracer("app").Start(context.Background(), "POST /payments")
		_, _ = engine.Do(ctx, idem.Call{
			Principal: "acct_1", Key: "7f3a", Method: "POST", Operation: "/payments",
			RequestID: idemotel.RequestID(ctx), Input: []byte(`{"amount":1000}`),
		}, func(context.Context) (idem.Response, error) {
			return idem.Response{Status: http.StatusCreated}, nil
		})
		server.End()
	}
	for _, s := range spans.Ended() {
		if s.Name() == "idempotency /payments" {
			fmt.Println(s.Name(), s.Attributes()[0].Value.AsString(), "links:", len(s.Links()))
		}
	}
	// Output:
	// idempotency /payments claimed links: 0
	// idempotency /payments replayed links: 1
}
