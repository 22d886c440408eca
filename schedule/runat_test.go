package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

// effectsAt counts the effects recorded for name's instant.
func effectsAt(t testing.TB, db *pgtest.Database, name string, instant time.Time) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE schedule = $1 AND instant = $2`, name, instant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// RunAt runs "the 09:00 Seoul job" for tomorrow's 09:00 now, through the
// ledger: a scheduled run, claimed with a fence, the Run the job would get
// then; yesterday's 09:00 likewise (recorded late, as a catch-up run is).
// An instant that is not one of the spec's is refused, naming the field,
// the instant and the spec's instants around it.
func TestRunAtZone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	seoul, err := time.LoadLocation("Asia/Seoul")
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, db, "test", Config{}, nil)
	def := Definition{Name: "push-resume", Spec: "0 9 * * *", TimeZone: "Asia/Seoul", Version: 1}
	var mu sync.Mutex
	var got []Run
	if err := in.s.Register(ctx, def, func(_ context.Context, r Run) error {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool).In(seoul)
	today := time.Date(now.Year(), now.Month(), now.Day(), 9, 0, 0, 0, seoul)
	tomorrow, yesterday := today.AddDate(0, 0, 1), today.AddDate(0, 0, -1)

	rec, err := in.s.RunAt(ctx, def.Name, tomorrow)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("the job ran %d times", len(got))
	}
	run := got[0]
	if !run.Instant.Equal(tomorrow) || run.Instant.Location() != time.UTC || run.Kind != kindScheduled || run.Attempt != 1 || run.Fence <= 0 || run.Holder != "test" || run.Schedule != def.Name {
		t.Fatalf("the job got %+v", run)
	}
	if !rec.Instant.Equal(tomorrow) || rec.Kind != kindScheduled || rec.State != stateSucceeded || rec.Attempt != 1 || rec.Fence != run.Fence ||
		rec.Holder != "test" || rec.Late || rec.Missed || rec.StartedAt.IsZero() || rec.FinishedAt.IsZero() {
		t.Fatalf("recorded %+v", rec)
	}
	if runs, err := in.s.Runs(ctx, def.Name, 10); err != nil || len(runs) != 1 || runs[0] != rec {
		t.Fatalf("Runs: %+v, %v; RunAt returned %+v", runs, err, rec)
	}

	rec, err = in.s.RunAt(ctx, def.Name, yesterday)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Kind != kindScheduled || rec.State != stateSucceeded || !rec.Late || rec.Fence <= run.Fence {
		t.Fatalf("yesterday's run: %+v", rec)
	}

	// 09:30 is no instant of the spec; nor is 09:00 in UTC.
	for _, bad := range []time.Time{today.Add(30 * time.Minute), time.Date(now.Year(), now.Month(), now.Day(), 9, 0, 0, 0, time.UTC)} {
		_, err = in.s.RunAt(ctx, def.Name, bad)
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("RunAt(%s): %v, want ErrInvalid", bad, err)
		}
		prev, next := def9(seoul, bad, false), def9(seoul, bad, true)
		for _, want := range []string{"instant", bad.In(seoul).Format(time.RFC3339), prev.Format(time.RFC3339), next.Format(time.RFC3339), "0 9 * * * (Asia/Seoul)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error %q does not say %q", err, want)
			}
		}
		t.Log(err)
	}
	if len(got) != 2 {
		t.Fatalf("the job ran %d times", len(got))
	}
	if _, err := in.s.RunAt(ctx, "nope", tomorrow); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown schedule: %v", err)
	}
	other := newInstance(t, db, "other", Config{}, nil)
	if _, err := other.s.RunAt(ctx, def.Name, tomorrow.AddDate(0, 0, 1)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("a Scheduler without the job: %v", err)
	}
}

// def9 is the 09:00 (Seoul) before (or after) t.
func def9(seoul *time.Location, t time.Time, after bool) time.Time {
	l := t.In(seoul)
	d := time.Date(l.Year(), l.Month(), l.Day(), 9, 0, 0, 0, seoul)
	if after && !d.After(t) {
		d = d.AddDate(0, 0, 1)
	}
	if !after && !d.Before(t) {
		d = d.AddDate(0, 0, -1)
	}
	return d
}

// A second RunAt of the same instant runs nothing: it returns the run as
// recorded with ErrRecorded. So does one of an instant the scheduler, a
// trigger or a backfill recorded, or one Prune may have deleted.
func TestRunAtTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	in := newInstance(t, db, "test", Config{}, nil)
	def := Definition{Name: "report", Spec: "0 6 * * *", TimeZone: "Europe/Berlin", Version: 1}
	if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 2, 5, 0, 0, 0, time.UTC) // 06:00 CET
	first, err := in.s.RunAt(ctx, def.Name, at)
	if err != nil {
		t.Fatal(err)
	}
	again, err := in.s.RunAt(ctx, def.Name, at.In(time.FixedZone("x", 3600)))
	if !errors.Is(err, ErrRecorded) || again != first {
		t.Fatalf("second RunAt: %+v, %v; want %+v and ErrRecorded", again, err, first)
	}
	t.Log(err)
	if n := effectsAt(t, db, def.Name, at); n != 1 {
		t.Fatalf("the job ran %d times", n)
	}
	// A backfilled instant is recorded: RunAt leaves it to the scheduler.
	bf, err := in.s.Backfill(ctx, def.Name, BackfillOptions{From: at, To: at.AddDate(0, 0, 1), Max: 1})
	if err != nil || len(bf.Instants) != 1 {
		t.Fatalf("backfill: %+v, %v", bf, err)
	}
	rec, err := in.s.RunAt(ctx, def.Name, bf.Instants[0])
	if !errors.Is(err, ErrRecorded) || rec.Kind != kindBackfill || rec.State != statePending {
		t.Fatalf("RunAt of a backfilled instant: %+v, %v", rec, err)
	}
	// A pruned instant may have run: RunAt runs nothing, WaitRun waits for
	// nothing.
	if _, err := db.Pool.Exec(ctx, `WITH d AS (DELETE FROM pgclaim_schedule_runs WHERE instant = $1)
		UPDATE pgclaim_schedules SET pruned_until = $1`, at); err != nil {
		t.Fatal(err)
	}
	if rec, err := in.s.RunAt(ctx, def.Name, at); !errors.Is(err, ErrRecorded) || !strings.Contains(err.Error(), "Prune") || rec != (RunRecord{}) {
		t.Fatalf("RunAt of a pruned instant: %+v, %v", rec, err)
	}
	if _, err := in.s.WaitRun(ctx, def.Name, at); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WaitRun of a pruned instant: %v", err)
	}
	if n := effectsAt(t, db, def.Name, at); n != 1 {
		t.Fatalf("the job ran %d times", n)
	}
}

// Instances calling RunAt for one instant at once run its job once: one
// of them records and runs it, the others get ErrRecorded and its record
// as they read it (pending, running or succeeded).
func TestRunAtConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("LeaseLocks=%v", lease), func(t *testing.T) {
			db := pgtest.NewDatabase(t)
			effectsTable(t, db.Pool)
			def := Definition{Name: "push-resume", Spec: "0 9 * * *", TimeZone: "Asia/Seoul", Version: 1}
			var ins []*instance
			for i := range 4 {
				in := newInstance(t, db, fmt.Sprintf("inst-%d", i), Config{LeaseLocks: lease}, nil)
				job := effect(in.pool)
				if err := in.s.Register(ctx, def, func(ctx context.Context, r Run) error {
					time.Sleep(50 * time.Millisecond) // the others arrive meanwhile
					return job(ctx, r)
				}); err != nil {
					t.Fatal(err)
				}
				ins = append(ins, in)
			}
			at := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC) // 09:00 KST
			for round := range 3 {
				at := at.AddDate(0, 0, round)
				// Two callers per instance: in one process and across.
				recs := make([]RunRecord, 2*len(ins))
				errs := make([]error, 2*len(ins))
				var wg sync.WaitGroup
				var start sync.WaitGroup
				start.Add(1)
				for i := range errs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start.Wait()
						recs[i], errs[i] = ins[i/2].s.RunAt(ctx, def.Name, at)
					}()
				}
				t0 := time.Now()
				start.Done()
				wg.Wait()
				t.Logf("round %d: %s", round, time.Since(t0))
				ran := 0
				for i, err := range errs {
					switch {
					case err == nil:
						ran++
					case errors.Is(err, ErrRecorded):
					default:
						t.Fatalf("instance %d: %v", i, err)
					}
				}
				if ran != 1 {
					t.Fatalf("%d callers ran it: %v", ran, errs)
				}
				for i, rec := range recs {
					if rec.Kind != kindScheduled || !rec.Instant.Equal(at) || rec.Attempt > 1 || (errs[i] == nil && (rec.State != stateSucceeded || rec.Attempt != 1)) {
						t.Fatalf("caller %d: %+v, %v", i, rec, errs[i])
					}
				}
				if n := effectsAt(t, db, def.Name, at); n != 1 {
					t.Fatalf("the job ran %d times", n)
				}
				rows := runsOf(t, db.Pool, def.Name)
				if r := rows[len(rows)-1]; !r.Instant.Equal(at) || r.State != stateSucceeded || r.Attempt != 1 {
					t.Fatalf("recorded %+v", r)
				}
			}
		})
	}
}

// A failing job is retried by the schedule's policy within RunAt: it
// returns once the run has ended, succeeded on a later attempt or failed
// after the last, as the scheduler records them.
func TestRunAtRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	in := newInstance(t, db, "test", Config{}, ev)
	var calls atomic.Int32
	failFirst := Definition{Name: "flaky", Spec: "*/5 * * * *", TimeZone: "UTC", Version: 1,
		Retry: RetryPolicy{MaxAttempts: 3, Backoff: 50 * time.Millisecond}}
	if err := in.s.Register(ctx, failFirst, func(context.Context, Run) error {
		if calls.Add(1) == 1 {
			return errors.New("boom")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 5, 0, 0, time.UTC)
	rec, err := in.s.RunAt(ctx, failFirst.Name, at)
	if err != nil || rec.State != stateSucceeded || rec.Attempt != 2 || calls.Load() != 2 {
		t.Fatalf("%+v, %v after %d calls", rec, err, calls.Load())
	}

	broken := Definition{Name: "broken", Spec: "*/5 * * * *", TimeZone: "UTC", Version: 1,
		Retry: RetryPolicy{MaxAttempts: 2, Backoff: 50 * time.Millisecond}}
	if err := in.s.Register(ctx, broken, func(context.Context, Run) error { panic("kaput") }); err != nil {
		t.Fatal(err)
	}
	rec, err = in.s.RunAt(ctx, broken.Name, at)
	if err == nil || errors.Is(err, ErrRecorded) || rec.State != stateFailed || rec.Attempt != 2 || !strings.Contains(rec.Reason, "kaput") || !strings.Contains(err.Error(), "kaput") {
		t.Fatalf("%+v, %v", rec, err)
	}
	t.Log(err)
	if n := len(ev.of(EventFinished)); n != 4 {
		t.Fatalf("%d attempts reported finished, want 4", n)
	}
}

// A paused schedule runs nothing: RunAt returns ErrPaused and records
// nothing; after Resume it runs.
func TestRunAtPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "test", Config{}, nil)
	def := Definition{Name: "report", Spec: "0 6 * * *", TimeZone: "UTC", Version: 1}
	if err := in.s.Register(ctx, def, func(context.Context, Run) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := in.s.Pause(ctx, def.Name, "migration", "ops"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 2, 6, 0, 0, 0, time.UTC)
	_, err := in.s.RunAt(ctx, def.Name, at)
	if !errors.Is(err, ErrPaused) || !strings.Contains(err.Error(), "migration") {
		t.Fatalf("paused: %v", err)
	}
	t.Log(err)
	if rows := runsOf(t, db.Pool, def.Name); len(rows) != 0 {
		t.Fatalf("recorded while paused: %+v", rows)
	}
	if err := in.s.Resume(ctx, def.Name); err != nil {
		t.Fatal(err)
	}
	if rec, err := in.s.RunAt(ctx, def.Name, at); err != nil || rec.State != stateSucceeded {
		t.Fatalf("after resume: %+v, %v", rec, err)
	}
}

// An instant run ahead of time is left alone by the scheduler when it
// comes due, and the instants before it are recorded and run as usual;
// WaitRun waits for those the scheduler runs, and for a triggered run.
func TestRunAtAheadAndWaitRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := pgtest.NewDatabase(t)
	effectsTable(t, db.Pool)
	in := newInstance(t, db, "test", Config{PollInterval: 100 * time.Millisecond}, nil)
	// Every instant runs, however late a loaded machine wakes the runner.
	def := Definition{Name: "tick", Spec: "* * * * * *", TimeZone: "UTC", Version: 1, CatchUp: CatchUpAll, Overlap: OverlapBufferAll}
	if err := in.s.Register(ctx, def, effect(in.pool)); err != nil {
		t.Fatal(err)
	}
	now := dbNow(t, db.Pool).Truncate(time.Second)
	ahead := now.Add(4 * time.Second)
	if _, err := in.s.RunAt(ctx, def.Name, ahead); err != nil {
		t.Fatal(err)
	}
	in.start(t)
	before := ahead.Add(-time.Second)
	rec, err := in.s.WaitRun(ctx, def.Name, before)
	if err != nil || rec.Kind != kindScheduled || rec.State != stateSucceeded {
		t.Fatalf("WaitRun(%s): %+v, %v", before, rec, err)
	}
	after, err := in.s.WaitRun(ctx, def.Name, ahead.Add(time.Second))
	if err != nil || after.State != stateSucceeded {
		t.Fatalf("WaitRun after: %+v, %v", after, err)
	}
	if n := effectsAt(t, db, def.Name, ahead); n != 1 {
		t.Fatalf("the instant run ahead ran %d times", n)
	}
	for _, r := range runsOf(t, db.Pool, def.Name) {
		// An instant a later one overtook before it was recorded (a runner
		// woken late on a loaded machine) is missed and, by CatchUpAll, run;
		// the one run ahead was recorded before it came due.
		if r.Instant.After(now) && !r.Instant.After(ahead) && (r.State != stateSucceeded || r.Missed && r.Instant.Equal(ahead)) {
			t.Errorf("instant %s: %+v", r.Instant, r)
		}
	}
	if got := len(runsOf(t, db.Pool, def.Name)); got < 5 {
		t.Fatalf("%d runs recorded", got)
	}

	trig, _, err := in.s.Trigger(ctx, def.Name)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := in.s.WaitRun(ctx, def.Name, trig); err != nil || rec.Kind != kindTriggered || rec.State != stateSucceeded {
		t.Fatalf("WaitRun(trigger): %+v, %v", rec, err)
	}

	// WaitRun honours ctx, and refuses an instant nothing would record.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if rec, err := in.s.WaitRun(short, def.Name, now.Add(time.Hour)); !errors.Is(err, context.DeadlineExceeded) || rec != (RunRecord{}) {
		t.Fatalf("WaitRun past ctx: %+v, %v", rec, err)
	}
	if _, err := in.s.WaitRun(ctx, def.Name, now.Add(time.Hour+time.Millisecond)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WaitRun of a non-instant: %v", err)
	}
	if _, err := in.s.WaitRun(ctx, def.Name, now.Add(-time.Hour)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WaitRun before the definition's life: %v", err)
	}
}

// A RunAt whose ctx ends cancels the attempt and hands it back as a
// retry, as a scheduler's shutdown does; the run stays recorded, so a
// second RunAt runs nothing and a scheduler runs the retry.
func TestRunAtCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "test", Config{}, nil)
	def := Definition{Name: "slow", Spec: "0 6 * * *", TimeZone: "UTC", Version: 1, Retry: RetryPolicy{MaxAttempts: 3, Backoff: 10 * time.Millisecond}}
	var calls atomic.Int32
	started := make(chan struct{})
	if err := in.s.Register(ctx, def, func(ctx context.Context, r Run) error {
		if calls.Add(1) == 1 {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2027, 3, 2, 6, 0, 0, 0, time.UTC)
	short, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := errors.New("the test stops")
	go func() { <-started; cancel(stop) }()
	rec, err := in.s.RunAt(short, def.Name, at)
	if !errors.Is(err, stop) || rec.State != stateRetrying || rec.Attempt != 1 || !strings.Contains(rec.Reason, "interrupted") {
		t.Fatalf("cancelled: %+v, %v", rec, err)
	}
	if again, err := in.s.RunAt(ctx, def.Name, at); !errors.Is(err, ErrRecorded) || again.State != stateRetrying {
		t.Fatalf("again: %+v, %v", again, err)
	}
	in.start(t)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	done, err := in.s.WaitRun(wctx, def.Name, at)
	if err != nil || done.State != stateSucceeded || done.Attempt != 2 || calls.Load() != 2 {
		t.Fatalf("the retry: %+v, %v after %d calls", done, err, calls.Load())
	}
}
