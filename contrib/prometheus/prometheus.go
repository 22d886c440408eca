package pgclaimprom

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	pgclaimotel "github.com/pgclaim/pgclaim/contrib/otel"
)

// Config configures New.
type Config struct {
	// Registerer receives the collector of pgclaim's series. Default:
	// prometheus.DefaultRegisterer (served by promhttp.Handler()).
	Registerer prometheus.Registerer
	// TracerProvider makes the tracer of the Observer's spans. Default:
	// the global one (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
}

// Metrics is a pgclaimotel.Observer whose instruments Prometheus collects:
// hand its ClaimHooks, GateHooks, ElectorHooks and ScheduleHooks to
// pgclaim's configs (and call WatchTables for the rows per state), as
// with any Observer.
type Metrics struct {
	*pgclaimotel.Observer
	provider *sdkmetric.MeterProvider
}

// New registers a collector of pgclaim's series in cfg.Registerer and
// returns the Observer that feeds it. It fails when the registerer
// refuses the collector (one is registered there already).
func New(cfg Config) (*Metrics, error) {
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutTargetInfo(),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	obs, err := pgclaimotel.New(pgclaimotel.Config{MeterProvider: mp, TracerProvider: cfg.TracerProvider})
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	return &Metrics{Observer: obs, provider: mp}, nil
}

// Shutdown shuts down the MeterProvider that feeds the collector; the
// Observer records nothing after it.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }
