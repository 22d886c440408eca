package pgclaimotel_test

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgclaim/pgclaim/claim"
	pgclaimotel "github.com/pgclaim/pgclaim/contrib/otel"
)

// A service with hooks of its own adds the Observer's with Multi. Here one
// event stands for the statements a claimer (claim.New with cfg) reports.
func Example() {
	reader := sdkmetric.NewManualReader()
	obs, err := pgclaimotel.New(pgclaimotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		panic(err)
	}
	cfg := claim.Config{From: "PAUSED", To: "PROCESSING", Hooks: pgclaimotel.Multi[claim.Event]{
		claim.HooksFunc(func(_ context.Context, e claim.Event) { fmt.Println("the service's hooks:", e.Kind, e.Rows) }),
		obs.ClaimHooks(),
	}}
	cfg.Hooks.Observe(context.Background(), claim.Event{Kind: claim.EventClaimed, Table: `"jobs"`, State: "PROCESSING", Rows: 3, Duration: 2 * time.Millisecond})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				fmt.Println(m.Name, m.Unit, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
			}
		}
	}
	// Output:
	// the service's hooks: claimed 3
	// pgclaim.claim.claims {claim} pgclaim.claim.outcome=claimed,pgclaim.state=PROCESSING,pgclaim.table=jobs 3
}
