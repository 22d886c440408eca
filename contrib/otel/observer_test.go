package pgclaimotel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	pgclaimotel "github.com/pgclaim/pgclaim/contrib/otel"
	"github.com/pgclaim/pgclaim/contrib/otel/scenario"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Two instances, each with an in-memory reader, run claims, gate ticks, a
// schedule with missed instants and a failover; the readers hold the
// documented series with the values the run implies, and the tracer the
// spans of runs, attempts and claim statements.
func TestMetricsAndSpans(t *testing.T) {
	db := pgtest.NewDatabase(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	var readers [2]*sdkmetric.ManualReader
	var obs [2]*pgclaimotel.Observer
	for i := range obs {
		readers[i] = sdkmetric.NewManualReader()
		var err error
		obs[i], err = pgclaimotel.New(pgclaimotel.Config{
			MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[i])),
			TracerProvider: tp,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	scenario.Run(t, db, obs, func(t testing.TB, i int, s scenario.Series) (float64, bool) {
		return collect(t, readers[i], s)
	})

	find := func(name string, attrs ...attribute.KeyValue) sdktrace.ReadOnlySpan {
		t.Helper()
	next:
		for _, s := range spans.GetSpans().Snapshots() {
			if s.Name() != name {
				continue
			}
			for _, want := range attrs {
				if !hasAttr(s.Attributes(), want) {
					continue next
				}
			}
			return s
		}
		t.Errorf("no span %q with %v", name, attrs)
		return nil
	}
	if s := find("pgclaim.gate run", attribute.String("pgclaim.job", "report"), attribute.String("pgclaim.gate.outcome", "failed")); s != nil {
		if s.Status().Code != codes.Error || !s.EndTime().After(s.StartTime()) || !hasKey(s.Attributes(), "pgclaim.fence") || !hasKey(s.Attributes(), "pgclaim.instant") {
			t.Errorf("failed run's span: status %v, %v..%v, attributes %v", s.Status(), s.StartTime(), s.EndTime(), s.Attributes())
		}
	}
	if s := find("pgclaim.schedule attempt", attribute.String("pgclaim.schedule", "tick"), attribute.Int("pgclaim.attempt", 1),
		attribute.String("pgclaim.schedule.outcome", "succeeded")); s != nil {
		if !hasKey(s.Attributes(), "pgclaim.fence") || !hasKey(s.Attributes(), "pgclaim.instant") || s.Status().Code == codes.Error {
			t.Errorf("attempt's span: status %v, attributes %v", s.Status(), s.Attributes())
		}
	}
	find("pgclaim.claim claimed", attribute.String("pgclaim.table", "jobs"), attribute.Int("pgclaim.rows", 3))
	find("pgclaim.claim lost", attribute.String("pgclaim.table", "jobs"))
}

func hasAttr(attrs []attribute.KeyValue, want attribute.KeyValue) bool {
	for _, a := range attrs {
		if a.Key == want.Key && a.Value == want.Value {
			return true
		}
	}
	return false
}

func hasKey(attrs []attribute.KeyValue, key attribute.Key) bool {
	for _, a := range attrs {
		if a.Key == key {
			return true
		}
	}
	return false
}

// collect sums the values (a histogram's counts) of s's data points in
// what r collects now.
func collect(t testing.TB, r *sdkmetric.ManualReader, s scenario.Series) (sum float64, found bool) {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	match := func(set attribute.Set) bool {
		for k, v := range s.Labels {
			if got, ok := set.Value(attribute.Key(k)); !ok || got.String() != v {
				return false
			}
		}
		found = true
		return true
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != s.Name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += float64(p.Value)
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += float64(p.Value)
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						sum += float64(p.Count)
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return sum, found
}
