// Package pgclaimprom exposes what pgclaim does as Prometheus metrics. It
// is a module of its own (github.com/pgclaim/pgclaim/contrib/prometheus),
// so that pgclaim's core module depends on neither Prometheus nor
// OpenTelemetry.
//
// New returns the instruments of package pgclaimotel (the module
// github.com/pgclaim/pgclaim/contrib/otel) on a MeterProvider whose only
// reader is OpenTelemetry's Prometheus exporter, registered as a collector
// in the service's own client_golang Registerer: the service's existing
// /metrics handler (promhttp) serves pgclaim's series next to its own.
//
// # Why the exporter, not a collector of its own
//
// A Go team that scrapes with Prometheus already runs client_golang, and
// gets exactly that here: one prometheus.Collector in its registry. Built
// on the OpenTelemetry instruments, the Prometheus series are the same
// instruments, with the same attributes and histogram buckets, as a team
// exporting OTLP gets; there is one mapping from pgclaim's events to
// instruments to keep right, one set of docs (docs/OBSERVABILITY.md) and
// dashboards that survive a move from scraping to OTLP. The cost is the
// OpenTelemetry SDK as a dependency of this module (not of the core). The
// names are pinned: New sets the exporter's translation strategy to
// UnderscoreEscapingWithSuffixes (pgclaim.claim.claims becomes
// pgclaim_claim_claims_total, pgclaim.gate.run.duration
// pgclaim_gate_run_duration_seconds), whatever the exporter's default
// becomes, and leaves out target_info and the otel_scope_* labels, so that
// the alert rules in alerts.yml keep matching.
package pgclaimprom
