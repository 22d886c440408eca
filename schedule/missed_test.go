package schedule

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// Every instance was down past the grace: Missed lists the instants due
// meanwhile from the database alone; an instance that comes back reports
// each (EventMissed), records it by its catch-up policy, and the list
// empties.
func TestMissedInstants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	in := newInstance(t, db, "a", Config{Grace: time.Second}, ev)
	def := Definition{Name: "nightly", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	t0 := dbNow(t, db.Pool)
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = $1`, t0.Add(-8500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	missed, more, err := in.s.Missed(ctx, def.Name, time.Time{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	// Due in (t0-8.5s, t0-1s]: seven or eight instants.
	if len(missed) < 7 || len(missed) > 8 || more {
		t.Fatalf("missed %v (more %v), want the 7-8 instants older than the grace", missed, more)
	}
	if m, more, _ := in.s.Missed(ctx, def.Name, time.Time{}, 3); len(m) != 3 || !more || !m[0].Equal(missed[0]) {
		t.Fatalf("capped at 3: %v more %v", m, more)
	}
	in.start(t)
	waitFor(t, 10*time.Second, "the missed instants recorded", func() bool {
		m, _, err := in.s.Missed(ctx, def.Name, time.Time{}, 100)
		return err == nil && len(m) == 0
	})
	// Each is reported once its record has been written: a moment after
	// the record is visible.
	unreported := func() []time.Time {
		reported := map[time.Time]bool{}
		for _, e := range ev.of(EventMissed) {
			reported[e.Instant] = true
		}
		var left []time.Time
		for _, m := range missed {
			if !reported[m] {
				left = append(left, m)
			}
		}
		return left
	}
	for deadline := time.Now().Add(5 * time.Second); len(unreported()) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, m := range unreported() {
		t.Errorf("missed instant %v not reported", m)
	}
	if _, _, err := in.s.Missed(ctx, "nope", time.Time{}, 1); err == nil {
		t.Error("unknown schedule: no error")
	}
}

// recLog collects log records.
type recLog struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *recLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *recLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recLog) WithGroup(string) slog.Handler      { return l }

// lines returns the records at level or above whose message starts with
// prefix, and their attributes.
func (l *recLog) lines(level slog.Level, prefix string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if r.Level >= level && strings.HasPrefix(r.Message, prefix) {
			m := map[string]string{"msg": r.Message}
			r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
			out = append(out, m)
		}
	}
	return out
}

// After a downtime, the instants missed are logged as one line per
// schedule (count, first, last), each instant at debug level; the hooks
// still hear of each.
func TestMissedLoggedAsOneLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	logs := &recLog{}
	in := newInstance(t, db, "a", Config{Grace: time.Second, Logger: slog.New(logs)}, ev)
	def := Definition{Name: "every-second", Spec: "* * * * * *", Version: 1, CatchUp: CatchUpNone}
	if err := in.s.Register(ctx, def, nop); err != nil {
		t.Fatal(err)
	}
	t0 := dbNow(t, db.Pool)
	// Ten minutes down: more instants than one statement records.
	if _, err := db.Pool.Exec(ctx, `UPDATE pgclaim_schedules SET starts_at = $1`, t0.Add(-10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	missed, _, err := in.s.Missed(ctx, def.Name, time.Time{}, 1000)
	if err != nil || len(missed) < 590 {
		t.Fatalf("missed %d (%v), want about 600", len(missed), err)
	}
	in.start(t)
	waitFor(t, 20*time.Second, "the missed instants recorded", func() bool {
		return len(ev.of(EventMissed)) >= len(missed)
	})
	in.stop()
	warn := logs.lines(slog.LevelInfo, "schedule: missed")
	if len(warn) != 1 {
		t.Fatalf("%d lines at info or above for %d missed instants, want 1: %v", len(warn), len(missed), warn)
	}
	// The scheduler starts a moment after Missed looked: an instant or two
	// more may have passed meanwhile.
	if w := warn[0]; !within(w["missed"], len(missed), len(missed)+3) || w["first"] == "" || w["last"] == "" || !strings.HasPrefix(w["reason"], "missed: ") {
		t.Errorf("the summary line %v; want missed=%d (or a few more), first, last and the policy's reason", w, len(missed))
	}
	if n := len(logs.lines(slog.LevelInfo, "schedule: skipped")); n != 0 {
		t.Errorf("%d skipped lines at info beside the summary, want 0", n)
	}
	if n := len(logs.lines(slog.LevelDebug, "schedule: missed")); n < 1+len(missed) {
		t.Errorf("%d missed lines in all, want the summary and %d at debug", n, len(missed))
	}
}

// within reports whether the decimal v is in [lo, hi].
func within(v string, lo, hi int) bool {
	n, err := strconv.Atoi(v)
	return err == nil && n >= lo && n <= hi
}
