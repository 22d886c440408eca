package main

// pgclaim schedules pause, resume and trigger: an operator's changes to one
// schedule.

import (
	"context"
	"fmt"
	"strings"
)

func runSchedulesPause(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules pause", "schedules pause NAME --note TEXT [--by WHO] [--database-url URL] [--json]", `
Pauses the schedule NAME: no new run of it starts on any instance (a run
already running finishes); instants that come due meanwhile are decided at
resume by its catch-up policy. The note and who paused are stored with the
time. Pausing a paused schedule replaces its note and keeps its pause time.`)
	note := f.String("note", "", "why the schedule is paused (`TEXT`, required)")
	by := f.String("by", "", "who pauses it (`WHO`; default: $USER)")
	name, pool, s, err := openNamed(ctx, f, args, nil, func() error { return require("note", strings.TrimSpace(*note)) })
	if err != nil {
		return err
	}
	defer pool.Close()
	if *by == "" {
		*by = e.getenv("USER")
	}
	if err := s.Pause(ctx, name, *note, *by); err != nil {
		return schedFail("pausing "+name, name, err)
	}
	st, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, toScheduleJSON(st))
	}
	fmt.Fprintf(e.stdout, "paused %s %s\n", name, pausedCell(toScheduleJSON(st)))
	return nil
}

func runSchedulesResume(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules resume", "schedules resume NAME [--database-url URL] [--json]", `
Resumes the paused schedule NAME on every instance. The instants that came
due while it was paused are decided by its catch-up policy. Resuming a
schedule that is not paused changes nothing.`)
	name, pool, s, err := openNamed(ctx, f, args, nil, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if err := s.Resume(ctx, name); err != nil {
		return schedFail("resuming "+name, name, err)
	}
	st, err := s.Status(ctx, name)
	if err != nil {
		return schedFail("reading "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, toScheduleJSON(st))
	}
	if !before.Paused {
		fmt.Fprintf(e.stdout, "%s was not paused: nothing changed\n", name)
		return nil
	}
	fmt.Fprintf(e.stdout, "resumed %s (paused since %s); next due %s\n", name, fmtTime(before.PausedAt), fmtTime(st.NextDue))
	return nil
}

func runSchedulesTrigger(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "schedules trigger", "schedules trigger NAME [--database-url URL] [--json]", `
Records a run of kind triggered of the schedule NAME at the database's time,
which an instance running the schedule runs once. While a triggered run of
NAME is still open, that one is reported instead ("already open") and none is
added: two operators triggering together get one run. A triggered run waits
while the schedule is paused.`)
	name, pool, s, err := openNamed(ctx, f, args, nil, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	at, created, err := s.Trigger(ctx, name)
	if err != nil {
		return schedFail("triggering "+name, name, err)
	}
	if f.json {
		return writeJSON(e.stdout, triggerJSON{Schedule: name, Instant: at.UTC(), Created: created})
	}
	if created {
		fmt.Fprintf(e.stdout, "triggered %s: run %s created\n", name, fmtTime(at))
	} else {
		fmt.Fprintf(e.stdout, "%s: triggered run %s already open: not triggered again\n", name, fmtTime(at))
	}
	return nil
}
