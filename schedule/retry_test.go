package schedule

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 6, Backoff: time.Second, MaxBackoff: 5 * time.Second}
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 5: 5 * time.Second} {
		if got := p.delay(n); got != want {
			t.Errorf("delay(%d) = %s, want %s", n, got, want)
		}
	}
	p.MaxBackoff = 0
	if got := p.delay(4); got != time.Second {
		t.Errorf("without MaxBackoff: delay(4) = %s, want Backoff", got)
	}
}

// A failing job is retried with back-off (in database time), then recorded
// failed with its reason; a panic is a failed attempt with the panic as
// reason.
func TestRetryThenFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	ev := &events{}
	yearly := "0 0 1 1 *"
	failing := Definition{Name: "failing", Spec: yearly, Version: 1, Retry: RetryPolicy{MaxAttempts: 3, Backoff: 300 * time.Millisecond, MaxBackoff: time.Second}}
	panicking := Definition{Name: "panicking", Spec: yearly, Version: 1, Retry: RetryPolicy{MaxAttempts: 1}}
	for _, h := range []string{"a", "b"} {
		in := newInstance(t, db, h, Config{}, ev)
		record := effect(in.pool)
		if err := in.s.Register(ctx, failing, func(ctx context.Context, r Run) error {
			if err := record(ctx, r); err != nil {
				return err
			}
			return errors.New("boom")
		}); err != nil {
			t.Fatal(err)
		}
		if err := in.s.Register(ctx, panicking, func(context.Context, Run) error { panic("kaput") }); err != nil {
			t.Fatal(err)
		}
		in.start(t)
	}
	for _, d := range []Definition{failing, panicking} {
		if _, _, err := newInstance(t, db, "ops", Config{}, nil).s.Trigger(ctx, d.Name); err != nil {
			t.Fatal(err)
		}
	}
	final := func(name string) *runRow {
		for _, r := range runsOf(t, db.Pool, name) {
			if r.State == stateFailed {
				return &r
			}
		}
		return nil
	}
	waitFor(t, 20*time.Second, "both runs to fail", func() bool { return final("failing") != nil && final("panicking") != nil })
	f := final("failing")
	if f.Attempt != 3 || f.Kind != kindTriggered || !strings.Contains(deref(f.Reason), "attempt 3 of 3: boom") {
		t.Fatalf("failing: %+v reason %q", f, deref(f.Reason))
	}
	rows, err := db.Pool.Query(ctx, `SELECT attempt, extract(epoch FROM at - lag(at) OVER (ORDER BY attempt)) * 1000 FROM effects WHERE schedule = 'failing' ORDER BY attempt`)
	if err != nil {
		t.Fatal(err)
	}
	var gaps []float64
	for rows.Next() {
		var a int
		var gap *float64
		if err := rows.Scan(&a, &gap); err != nil {
			t.Fatal(err)
		}
		if gap != nil {
			gaps = append(gaps, *gap)
		}
	}
	if len(gaps) != 2 || gaps[0] < 300 || gaps[1] < 600 {
		t.Fatalf("gaps between attempts %v ms, want at least 300 and 600 (back-off doubling)", gaps)
	}
	t.Logf("gaps between attempts: %.0f ms, %.0f ms (back-off 300 ms doubling)", gaps[0], gaps[1])
	p := final("panicking")
	if p.Attempt != 1 || !strings.Contains(deref(p.Reason), "panicked: kaput") {
		t.Fatalf("panicking: %+v reason %q", p, deref(p.Reason))
	}
	var retrying int
	for _, e := range ev.of(EventFinished) {
		if e.Schedule == "failing" && e.State == stateRetrying {
			retrying++
		}
	}
	if retrying != 2 {
		t.Errorf("%d retrying events, want 2", retrying)
	}
}
