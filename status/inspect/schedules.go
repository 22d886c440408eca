package inspect

import (
	"fmt"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/schedule"
)

// Schedule is a schedule's status (schedule.Status) as JSON: the shape of
// "pgclaim schedules list --json". Times are UTC.
type Schedule struct {
	Name             string     `json:"name"`
	Spec             string     `json:"spec"`
	TimeZone         string     `json:"time_zone"`
	Version          int        `json:"version"`
	NextDue          *time.Time `json:"next_due"`
	Last             *LastRun   `json:"last"`
	OpenRuns         int        `json:"open_runs"`
	Missed           int        `json:"missed"`            // recorded missed + unrecorded
	MissedUnrecorded int        `json:"missed_unrecorded"` // due, past the grace, no row
	MissedMore       bool       `json:"missed_more"`       // the unrecorded count stopped at its bound
	Late             int        `json:"late"`              // runs started later than the definition's LateAfter
	Overdue          int        `json:"overdue"`           // runs with an attempt past its ExpectedDuration
	Paused           bool       `json:"paused"`
	PausedNote       *string    `json:"paused_note"`
	PausedBy         *string    `json:"paused_by"`
	PausedAt         *time.Time `json:"paused_at"`
	PrunedUntil      *time.Time `json:"pruned_until"` // the newest instant whose run was deleted (retention, Prune)
	Retention        *string    `json:"retention"`    // finished runs kept this long ("168h0m0s"), "keep" (all), null (no pass yet)
	DBNow            time.Time  `json:"db_now"`
}

// LastRun is a schedule's latest outcome (schedule.LastRun) as JSON.
type LastRun struct {
	Instant    time.Time  `json:"instant"`
	Kind       string     `json:"kind"`
	State      string     `json:"state"`
	Attempt    int        `json:"attempt"`
	Reason     *string    `json:"reason"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// ScheduleOf converts a schedule.Status.
func ScheduleOf(st schedule.Status) Schedule {
	out := Schedule{
		Name: st.Name, Spec: st.Spec, TimeZone: st.TimeZone, Version: st.Version, NextDue: timePtr(st.NextDue),
		OpenRuns: st.OpenRuns, Missed: st.Missed, MissedUnrecorded: st.MissedUnrecorded, MissedMore: st.MissedMore,
		Late: st.Late, Overdue: st.Overdue,
		Paused: st.Paused, PausedNote: strPtr(st.PausedNote), PausedBy: strPtr(st.PausedBy), PausedAt: timePtr(st.PausedAt),
		PrunedUntil: timePtr(st.PrunedUntil), Retention: retentionPtr(st.Retention), DBNow: st.DBNow.UTC(),
	}
	if l := st.Last; l != nil {
		out.Last = &LastRun{Instant: l.Instant.UTC(), Kind: l.Kind, State: l.State, Attempt: l.Attempt,
			Reason: strPtr(l.Reason), StartedAt: timePtr(l.StartedAt), FinishedAt: timePtr(l.FinishedAt)}
	}
	return out
}

// Run is one run of a schedule (schedule.RunRecord) as JSON: the shape of
// "pgclaim schedules runs NAME --json". Times are UTC.
type Run struct {
	Instant    time.Time  `json:"instant"`
	Kind       string     `json:"kind"`  // scheduled, triggered, backfill
	State      string     `json:"state"` // pending, running, retrying, succeeded, failed, skipped
	Attempt    int        `json:"attempt"`
	Fence      int64      `json:"fence"` // the latest attempt's fencing token (0 before the first)
	Holder     *string    `json:"holder"`
	Reason     *string    `json:"reason"`
	Missed     bool       `json:"missed"`
	Late       bool       `json:"late"`
	Overdue    bool       `json:"overdue"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// RunOf converts a schedule.RunRecord.
func RunOf(r schedule.RunRecord) Run {
	return Run{
		Instant: r.Instant.UTC(), Kind: r.Kind, State: r.State, Attempt: r.Attempt, Fence: r.Fence,
		Holder: strPtr(r.Holder), Reason: strPtr(r.Reason), Missed: r.Missed, Late: r.Late, Overdue: r.Overdue,
		StartedAt: timePtr(r.StartedAt), FinishedAt: timePtr(r.FinishedAt),
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// retentionPtr is Status.Retention as JSON: nil until a pass reported one.
func retentionPtr(d time.Duration) *string {
	switch {
	case d == 0:
		return nil
	case d < 0:
		return strPtr("keep")
	}
	return strPtr(d.String())
}

// RetentionText is a schedule's retention for people: "7d", "36h",
// "keep all", or "" while no pass reported one.
func RetentionText(r *string) string {
	if r == nil {
		return ""
	}
	if *r == "keep" {
		return "keep all"
	}
	d, err := time.ParseDuration(*r)
	if err != nil {
		return *r
	}
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "0m")
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
