// Package pgclaimotel reports what pgclaim does as OpenTelemetry metrics
// and spans. It is a module of its own (github.com/pgclaim/pgclaim/contrib/otel),
// so that pgclaim's core module does not depend on OpenTelemetry.
//
// An Observer holds the instruments. Its hooks plug into the Hooks field of
// pgclaim's configs:
//
//   - ClaimHooks into claim.Config.Hooks (claimers, and the workers and
//     sweepers built on them),
//   - GateHooks into gate.Config.Hooks and gate.LeaseConfig.Hooks,
//   - ElectorHooks into gate.ElectorConfig.Hooks (the leader gauge),
//   - ScheduleHooks into schedule.Config.Hooks.
//
// A service that already has hooks adds the Observer's with Multi, which
// hands every event to each of a list of hooks in turn.
//
// WatchTables, off unless called, counts the rows per state of claimed
// tables on an interval, and the age of the oldest claim in progress.
//
// Every instrument, its unit and its attributes are listed in
// docs/OBSERVABILITY.md of the repository; names follow OpenTelemetry's
// conventions (lower-case, dot-separated namespaces under "pgclaim", units
// in UCUM: "s" for durations, "{claim}", "{row}" and the like for counts).
//
// # Spans
//
// pgclaim's hooks report an event after the fact (Observe returns no
// context), so a span cannot enclose the job's own spans. The Observer
// makes a span only from an event that carries both ends: an event that
// reports a finished statement or run and how long it took. The span
// starts that long before the event and ends at it, as a child of the span
// in the event's context (the caller's):
//
//   - "pgclaim.schedule attempt": one per attempt that finished
//     (schedule.EventFinished), with the schedule, instant, attempt, fence,
//     run kind and outcome;
//   - "pgclaim.gate run": one per gate run that finished (gate.EventFinished:
//     a tick of Once or CatchUp, a run of Exclusive or Lease.Do), with the
//     job, instant (for ticks), fence and outcome;
//   - "pgclaim.claim <operation>": one per claim statement that moved rows
//     (a claim, a batch claim, a finish, a release, a sweep batch, a lost
//     claim), with the table, the rows and the state. A claim event names
//     no fence or attempt (a batch holds one fence per row), so these spans
//     carry none.
//
// A run that is lost, or an attempt whose completion is refused, ends with
// no duration in its event and gets no span; it is counted.
package pgclaimotel
