package pgclaimotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the Observer's meter and
// tracer.
const ScopeName = "github.com/pgclaim/pgclaim/contrib/otel"

// Config configures an Observer.
type Config struct {
	// MeterProvider makes the meter the instruments are created with.
	// Default: otel.GetMeterProvider(), the global one.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the tracer the spans are started with.
	// Default: otel.GetTracerProvider(), the global one.
	TracerProvider trace.TracerProvider
}

// Attribute keys of the instruments and spans (see docs/OBSERVABILITY.md).
const (
	keyTable       = attribute.Key("pgclaim.table")
	keyClaimOut    = attribute.Key("pgclaim.claim.outcome")
	keyClaimOp     = attribute.Key("pgclaim.claim.operation")
	keyState       = attribute.Key("pgclaim.state")
	keySweepReason = attribute.Key("pgclaim.sweep.reason")
	keyRows        = attribute.Key("pgclaim.rows")
	keyJob         = attribute.Key("pgclaim.job")
	keyGateOut     = attribute.Key("pgclaim.gate.outcome")
	keySkipReason  = attribute.Key("pgclaim.skip.reason")
	keyElection    = attribute.Key("pgclaim.election")
	keySchedule    = attribute.Key("pgclaim.schedule")
	keyRunKind     = attribute.Key("pgclaim.run.kind")
	keySchedOut    = attribute.Key("pgclaim.schedule.outcome")
	keyInstant     = attribute.Key("pgclaim.instant")
	keyAttempt     = attribute.Key("pgclaim.attempt")
	keyFence       = attribute.Key("pgclaim.fence")
	keyHolder      = attribute.Key("pgclaim.holder")
)

// Bucket boundaries, in seconds, of the histograms: statements take
// milliseconds, runs seconds to hours, and a wake-up is late by
// milliseconds to minutes.
var (
	statementBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	runBuckets       = []float64{0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}
	lagBuckets       = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
)

// Observer turns pgclaim's events into metrics and spans. Build one per
// process (or per MeterProvider) with New and hand its hooks to pgclaim's
// configs; it is safe for concurrent use.
type Observer struct {
	meter  metric.Meter
	tracer trace.Tracer

	claims, lost, swept metric.Int64Counter
	statement           metric.Float64Histogram

	ticks, skips metric.Int64Counter
	runDuration  metric.Float64Histogram
	leader       metric.Int64Gauge

	attempts, schedLost, missed metric.Int64Counter
	late, overdue, skipped      metric.Int64Counter
	refused                     metric.Int64Counter
	attemptDuration, lag        metric.Float64Histogram
}

// New creates the Observer's instruments with cfg's providers. It fails
// only when the meter refuses an instrument.
func New(cfg Config) (*Observer, error) {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	o := &Observer{meter: mp.Meter(ScopeName), tracer: tp.Tracer(ScopeName)}
	m := o.meter
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	o.claims = counter("pgclaim.claim.claims", "{claim}", "Claims by outcome: rows claimed, claims refused (not claimed), claims finished to a state, claims released.")
	o.lost = counter("pgclaim.claim.lost", "{claim}", "Claims found no longer held by a finish, extend, release or heartbeat.")
	o.swept = counter("pgclaim.claim.swept", "{row}", "Stale rows moved by a sweeper, by the state moved to and why they were stale.")
	o.statement = histogram("pgclaim.claim.statement.duration", "Duration of the claim statements that moved rows or found claims lost.", statementBuckets)
	o.ticks = counter("pgclaim.gate.ticks", "{tick}", "Ticks and runs decided by a gate (Once, CatchUp, Exclusive, Lease.Do), by outcome.")
	o.skips = counter("pgclaim.gate.skips", "{tick}", "Ticks and runs a gate skipped, by reason.")
	o.runDuration = histogram("pgclaim.gate.run.duration", "Duration of the jobs a gate ran.", runBuckets)
	leader, err := m.Int64Gauge("pgclaim.election.leader", metric.WithUnit("{leader}"), metric.WithDescription("1 while this instance leads the election, 0 while it does not."))
	errs = append(errs, err)
	o.leader = leader
	o.attempts = counter("pgclaim.schedule.attempts", "{attempt}", "Attempts of schedule runs that ended with a recorded outcome, or that a takeover ended, by outcome.")
	o.schedLost = counter("pgclaim.schedule.lost", "{event}", "Attempts found to have lost their exclusivity, or whose completion was refused or could not be recorded.")
	o.missed = counter("pgclaim.schedule.instants.missed", "{instant}", "Scheduled instants that were due and had no run after the grace.")
	o.late = counter("pgclaim.schedule.runs.late", "{run}", "Runs whose first attempt started later than the schedule's LateAfter.")
	o.overdue = counter("pgclaim.schedule.attempts.overdue", "{attempt}", "Attempts that ran longer than the schedule's ExpectedDuration.")
	o.refused = counter("pgclaim.schedule.refused", "{episode}", "Reports of the database refusing the scheduler connections (too many clients, starting up): once per episode, then at most every 10 s.")
	o.skipped = counter("pgclaim.schedule.instants.skipped", "{instant}", "Instants recorded skipped, by the policy that skipped them.")
	o.attemptDuration = histogram("pgclaim.schedule.attempt.duration", "Duration of schedule attempts that ended with a recorded outcome.", runBuckets)
	o.lag = histogram("pgclaim.schedule.wakeup.lag", "Time from a run's instant to the start of its first attempt, by database time.", lagBuckets)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// add adds n to c with attrs.
func add(ctx context.Context, c metric.Int64Counter, n int, attrs ...attribute.KeyValue) {
	c.Add(ctx, int64(n), metric.WithAttributes(attrs...))
}

// record records d in seconds in h with attrs.
func record(ctx context.Context, h metric.Float64Histogram, d time.Duration, attrs ...attribute.KeyValue) {
	h.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
}

// span records a span called name that took d and ended now, as a child
// of ctx's span; err, when not nil, marks it failed.
func (o *Observer) span(ctx context.Context, name string, d time.Duration, err error, attrs ...attribute.KeyValue) {
	end := time.Now()
	_, sp := o.tracer.Start(ctx, name, trace.WithTimestamp(end.Add(-d)), trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindInternal))
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End(trace.WithTimestamp(end))
}
