package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// Status is a schedule as an operator sees it: its stored definition's
// spec, zone and version, when it comes due next, its latest outcome, its
// missed instants and its pause. Times are UTC, read or computed in the
// database's time.
type Status struct {
	// Name, Spec, TimeZone and Version are the stored definition's.
	Name     string
	Spec     string
	TimeZone string
	Version  int
	// NextDue is the schedule's first instant after the database's now
	// (and after the definition's life began), computed from the stored
	// definition; the zero Time when the spec has none within 5 years.
	// While Paused it is the instant that would come due next: it is not
	// run then, and is decided at Resume by the catch-up policy.
	NextDue time.Time
	// Last is the newest run, by instant, that is no longer pending
	// (running, retrying or finished) and whose instant has come (a future
	// instant run early by RunAt is not the latest); nil when there is none
	// yet.
	Last *LastRun
	// OpenRuns counts the runs not finished yet: pending, running or
	// retrying (of every kind: scheduled, triggered, backfill).
	OpenRuns int
	// Missed counts the missed instants: the rows recorded missed (an
	// instance recorded them after their grace and decided them by the
	// catch-up policy) plus MissedUnrecorded.
	Missed int
	// MissedUnrecorded counts the missed instants nothing has recorded yet
	// (see Scheduler.Missed), at most maxListedMissed; MissedMore says the
	// count stopped there and more follow.
	MissedUnrecorded int
	MissedMore       bool
	// Late counts the runs whose first attempt started more than the
	// definition's LateAfter after their instant; Overdue those with an
	// attempt that ran past its ExpectedDuration (rows kept in the ledger).
	Late    int
	Overdue int
	// Paused says the schedule is paused; PausedNote, PausedBy and
	// PausedAt are what Pause stored (empty while not paused).
	Paused     bool
	PausedNote string
	PausedBy   string
	PausedAt   time.Time
	// PrunedUntil is the newest scheduled or backfilled instant whose
	// finished run was deleted, by retention (Config.Retention) or Prune;
	// zero when none was. Instants up to it are never recorded again nor
	// reported missed.
	PrunedUntil time.Time
	// Retention is how long this schedule's finished runs are kept, as the
	// last retention pass of a running Scheduler applied it (Config.Retention
	// or Definition.Retention); KeepRuns when every run is kept (so set, or
	// the catch-up window reaches past it); zero until a pass has run.
	Retention time.Duration
	// DBNow is the database's time the status was computed at.
	DBNow time.Time
}

// LastRun is a schedule's latest outcome, as Status reports it.
type LastRun struct {
	// Instant is the run's instant (the trigger's time for a triggered
	// run).
	Instant time.Time
	// Kind is "scheduled", "triggered" or "backfill".
	Kind string
	// State is "running", "retrying", "succeeded", "failed" or "skipped".
	State string
	// Attempt counts the run's attempts so far (0 for a skipped instant).
	Attempt int
	// Reason is why it failed, is retrying or was skipped ("" if none).
	Reason string
	// StartedAt is when its latest attempt started (zero if never);
	// FinishedAt when it finished (zero while open).
	StartedAt  time.Time
	FinishedAt time.Time
}

// maxListedMissed bounds the unrecorded missed instants Status counts.
const maxListedMissed = 1000

// List returns the status of every stored schedule, by name — whether or
// not this Scheduler runs it (an operator's tool builds a Scheduler with
// New and registers nothing). The missed counts use this Scheduler's
// Config.Grace, which should be the one the service's instances use.
func (s *Scheduler) List(ctx context.Context) ([]Status, error) {
	return s.statuses(ctx, nil)
}

// Status returns the status of the schedule name, as List does. Unknown
// name: ErrNotFound.
func (s *Scheduler) Status(ctx context.Context, name string) (Status, error) {
	if name == "" {
		return Status{}, invalid("name", "must not be empty")
	}
	out, err := s.statuses(ctx, &name)
	if err != nil {
		return Status{}, err
	}
	if len(out) == 0 {
		return Status{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return out[0], nil
}

func (s *Scheduler) statuses(ctx context.Context, name *string) ([]Status, error) {
	rows, err := s.q.ScheduleStatuses(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	out := make([]Status, 0, len(rows))
	for _, r := range rows {
		st, err := s.status(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// status completes a row of ScheduleStatuses from the stored definition.
func (s *Scheduler) status(ctx context.Context, r store.ScheduleStatusesRow) (Status, error) {
	st, err := loadSchedule(ctx, s.q, r.Name)
	if err != nil {
		return Status{}, err
	}
	d := st.def
	out := Status{
		Name: d.Name, Spec: d.Spec, TimeZone: d.TimeZone, Version: d.Version,
		OpenRuns: int(r.OpenRuns), Late: int(r.LateRuns), Overdue: int(r.OverdueRuns), Paused: st.paused, DBNow: st.dbNow,
		PrunedUntil: st.prunedUntil, Retention: st.retention,
	}
	if st.paused {
		out.PausedNote, out.PausedBy, out.PausedAt = st.pausedNote, st.pausedBy, st.pausedAt
	}
	from := st.dbNow
	if st.startsAt.After(from) {
		from = st.startsAt
	}
	out.NextDue = st.spec.next(from)
	if r.LastInstant.Valid {
		out.Last = &LastRun{
			Instant: tm(r.LastInstant), Kind: r.LastKind, State: r.LastState, Attempt: int(r.LastAttempt),
			Reason: deref(r.LastReason), StartedAt: tm(r.LastStartedAt), FinishedAt: tm(r.LastFinishedAt),
		}
	}
	// Every due instant up to the newest recorded scheduled one has a row
	// (the runner records them in order), so the unrecorded ones follow it.
	missed, more, err := s.Missed(ctx, d.Name, st.cursor, maxListedMissed)
	if err != nil {
		return Status{}, err
	}
	out.MissedUnrecorded, out.MissedMore = len(missed), more
	out.Missed = int(r.MissedRecorded) + len(missed)
	return out, nil
}

// RunRecord is one run of a schedule as Scheduler.Runs, RunAt and WaitRun
// report it: a row of its ledger.
type RunRecord struct {
	// Instant is the run's instant (the trigger's time for a triggered
	// run); Kind is "scheduled", "triggered" or "backfill".
	Instant time.Time
	Kind    string
	// State is "pending", "running", "retrying", "succeeded", "failed" or
	// "skipped".
	State string
	// Attempt counts the attempts so far (0 before the first); Fence and
	// Holder are the latest attempt's fencing token and holder (0 and ""
	// before the first).
	Attempt int
	Fence   int64
	Holder  string
	// Reason is why it failed, is retrying or was skipped ("" if none).
	Reason string
	// Missed: the instant was recorded after its grace (no instance
	// recorded it in time) and catch-up decided it. Late: its first
	// attempt started more than the definition's LateAfter after it.
	// Overdue: an attempt ran past the definition's ExpectedDuration.
	Missed, Late, Overdue bool
	// StartedAt is when the latest attempt started (zero if never);
	// FinishedAt when the run finished (zero while open).
	StartedAt  time.Time
	FinishedAt time.Time
}

// Runs returns the newest limit (at least 1) runs of the schedule name by
// instant, newest first, of every kind and state, as its ledger holds
// them (Prune deletes old finished ones). Unknown name: ErrNotFound.
func (s *Scheduler) Runs(ctx context.Context, name string, limit int) ([]RunRecord, error) {
	if name == "" {
		return nil, invalid("name", "must not be empty")
	}
	rows, err := s.q.RecentRuns(ctx, store.RecentRunsParams{Schedule: name, MaxRuns: int32(min(max(limit, 1), 1<<30))})
	if err != nil {
		return nil, fmt.Errorf("schedule: %q: runs: %w", name, err)
	}
	if len(rows) == 0 {
		if _, err := s.Status(ctx, name); err != nil {
			return nil, err
		}
	}
	out := make([]RunRecord, 0, len(rows))
	for _, r := range rows {
		out = append(out, runRecord(r))
	}
	return out, nil
}

// runRecord is a row of the ledger as Runs reports it.
func runRecord(r store.RecentRunsRow) RunRecord {
	run := RunRecord{
		Instant: tm(r.Instant), Kind: r.Kind, State: r.State, Attempt: int(r.Attempt), Holder: deref(r.Holder),
		Reason: deref(r.Reason), Missed: r.Missed, Late: r.Late, Overdue: r.Overdue,
		StartedAt: tm(r.StartedAt), FinishedAt: tm(r.FinishedAt),
	}
	if r.Fence != nil {
		run.Fence = *r.Fence
	}
	return run
}
