package pgclaimotel

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

// snake turns an event's kind or reason ("not claimed", "lease expired")
// into an attribute value ("not_claimed", "lease_expired").
func snake(s string) string { return strings.ReplaceAll(s, " ", "_") }

// unquote turns a table name quoted as in SQL (claim.Event.Table:
// "jobs", "app"."jobs") back into the name given in claim.Table.Name (jobs,
// app.jobs), so that the pgclaim.table attribute of the hooks' series and
// of WatchTables' match. A name it cannot read is returned as it is.
func unquote(q string) string {
	var b strings.Builder
	for part := range strings.SplitSeq(q, `"."`) {
		part = strings.TrimSuffix(strings.TrimPrefix(part, `"`), `"`)
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strings.ReplaceAll(part, `""`, `"`))
	}
	if !strings.HasPrefix(q, `"`) || !strings.HasSuffix(q, `"`) {
		return q
	}
	return b.String()
}

// ClaimHooks returns the hooks for claim.Config.Hooks: pgclaim.claim.claims,
// .lost, .swept, .statement.duration and a span per statement.
func (o *Observer) ClaimHooks() claim.Hooks { return claimHooks{o} }

type claimHooks struct{ o *Observer }

func (h claimHooks) Observe(ctx context.Context, e claim.Event) {
	o := h.o
	op := snake(e.Kind.String())
	table := keyTable.String(unquote(e.Table))
	state := keyState.String(e.State)
	record(ctx, o.statement, e.Duration, table, keyClaimOp.String(op))
	err := e.Err
	switch e.Kind {
	case claim.EventClaimed, claim.EventFinished, claim.EventReleased:
		add(ctx, o.claims, e.Rows, table, keyClaimOut.String(op), state)
	case claim.EventNotClaimed:
		add(ctx, o.claims, e.Rows, table, keyClaimOut.String(op))
	case claim.EventLost:
		add(ctx, o.lost, e.Rows, table)
		err = claim.ErrLost
	case claim.EventSwept:
		add(ctx, o.swept, e.Rows, table, state, keySweepReason.String(snake(e.Reason)))
	}
	o.span(ctx, "pgclaim.claim "+op, e.Duration, err, table, state, keyRows.Int(e.Rows))
}

// GateHooks returns the hooks for gate.Config.Hooks and
// gate.LeaseConfig.Hooks: pgclaim.gate.ticks, .skips, .run.duration and a
// span per finished run.
func (o *Observer) GateHooks() gate.Hooks { return gateHooks{o} }

type gateHooks struct{ o *Observer }

func (h gateHooks) Observe(ctx context.Context, e gate.Event) {
	o := h.o
	job := keyJob.String(e.Name)
	switch e.Kind {
	case gate.EventFinished:
		out := keyGateOut.String(string(e.Outcome))
		add(ctx, o.ticks, 1, job, out)
		record(ctx, o.runDuration, e.Duration, job, out)
		attrs := []attribute.KeyValue{job, out, keyFence.Int64(e.Fence), keyHolder.String(e.Holder)}
		if !e.FireAt.IsZero() {
			attrs = append(attrs, keyInstant.String(e.FireAt.UTC().Format(time.RFC3339Nano)))
		}
		o.span(ctx, "pgclaim.gate run", e.Duration, e.Err, attrs...)
	case gate.EventAbandoned:
		add(ctx, o.ticks, 1, job, keyGateOut.String(string(gate.OutcomeAbandoned)))
	case gate.EventSkipped:
		add(ctx, o.ticks, 1, job, keyGateOut.String("skipped"))
		add(ctx, o.skips, 1, job, keySkipReason.String(gateSkipReason(e.Err)))
	}
}

// gateSkipReason classifies the Err of a gate.EventSkipped.
func gateSkipReason(err error) string {
	switch {
	case err == nil:
		return "nothing_due"
	case errors.Is(err, gate.ErrClockSkew):
		return "clock_skew"
	case errors.Is(err, gate.ErrHeld):
		return "held"
	case errors.Is(err, gate.ErrSkipped):
		return "claimed"
	}
	return "other"
}

// ElectorHooks returns the hooks for gate.ElectorConfig.Hooks: the gauge
// pgclaim.election.leader, 1 from the moment this instance leads an
// election (gate.EventAcquired) until it loses or resigns it
// (gate.EventLost, gate.EventReleased), when it turns 0. The gauge of an
// election appears with its first event; name the elections to have it
// read 0 from now on, before this instance has ever led them (so that an
// alert on "no instance leads" also sees standbys that never led). Call
// it once per elector, before the elector campaigns: naming an election
// sets its gauge to 0.
func (o *Observer) ElectorHooks(elections ...string) gate.Hooks {
	for _, name := range elections {
		o.leader.Record(context.Background(), 0, metric.WithAttributes(keyElection.String(name)))
	}
	return electorHooks{o}
}

type electorHooks struct{ o *Observer }

func (h electorHooks) Observe(ctx context.Context, e gate.Event) {
	var v int64
	switch e.Kind {
	case gate.EventAcquired:
		v = 1
	case gate.EventLost, gate.EventReleased:
	default:
		return
	}
	h.o.leader.Record(ctx, v, metric.WithAttributes(keyElection.String(e.Name)))
}

// ScheduleHooks returns the hooks for schedule.Config.Hooks:
// pgclaim.schedule.attempts, .lost, .instants.missed, .runs.late,
// .attempts.overdue, .instants.skipped, .refused, .attempt.duration,
// .wakeup.lag
// and a span per attempt that ended.
func (o *Observer) ScheduleHooks() schedule.Hooks { return scheduleHooks{o} }

type scheduleHooks struct{ o *Observer }

func (h scheduleHooks) Observe(ctx context.Context, e schedule.Event) {
	o := h.o
	sched := keySchedule.String(e.Schedule)
	kind := keyRunKind.String(e.RunKind)
	switch e.Kind {
	case schedule.EventStarted:
		// A retry starts after its backoff and a backfilled instant long
		// after it was due: only first attempts measure the wake-up.
		if e.Attempt == 1 && e.RunKind != "backfill" {
			record(ctx, o.lag, e.Duration, sched, kind)
		}
	case schedule.EventFinished:
		out := keySchedOut.String(e.State)
		add(ctx, o.attempts, 1, sched, kind, out)
		record(ctx, o.attemptDuration, e.Duration, sched, out)
		o.span(ctx, "pgclaim.schedule attempt", e.Duration, e.Err, sched, kind, out,
			keyInstant.String(e.Instant.UTC().Format(time.RFC3339Nano)), keyAttempt.Int(e.Attempt),
			keyFence.Int64(e.Fence), keyHolder.String(e.Holder))
	case schedule.EventLost:
		// Not an outcome: an attempt can be reported lost while it runs
		// and again when its completion is refused.
		add(ctx, o.schedLost, 1, sched, kind)
	case schedule.EventTakenOver:
		// The dead holder's attempt: recorded failed when it had no
		// attempts left, else abandoned (the next attempt starts here).
		out := "abandoned"
		if e.State == "failed" {
			out = "failed"
		}
		add(ctx, o.attempts, 1, sched, kind, keySchedOut.String(out))
	case schedule.EventMissed:
		add(ctx, o.missed, 1, sched, keyState.String(e.State))
	case schedule.EventSkipped:
		add(ctx, o.skipped, 1, sched, keySkipReason.String(scheduleSkipReason(e.Reason)))
	case schedule.EventLate:
		add(ctx, o.late, 1, sched, kind)
	case schedule.EventOverdue:
		add(ctx, o.overdue, 1, sched, kind)
	case schedule.EventRefused:
		add(ctx, o.refused, 1)
	}
}

// scheduleSkipReason classifies the Reason of a schedule.EventSkipped by
// the policy it begins with (see schedule.Event): "overlap", "catch_up"
// (an instant missed, skipped by the catch-up policy) or "paused".
func scheduleSkipReason(reason string) string {
	policy, _, _ := strings.Cut(reason, ": ")
	switch policy {
	case "overlap", "paused":
		return policy
	case "missed":
		return "catch_up"
	}
	return "other"
}
