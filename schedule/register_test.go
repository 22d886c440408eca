package schedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

func nop(context.Context, Run) error { return nil }

func TestRegisterVersionRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ev := &events{}
	a := newInstance(t, db, "a", Config{}, ev)
	v1 := Definition{Name: "report", Spec: "0 9 * * *", TimeZone: "Europe/Berlin", Version: 1}
	if err := a.s.Register(ctx, v1, nop); err != nil {
		t.Fatal(err)
	}
	st, err := loadSchedule(ctx, a.s.q, "report")
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := v1.normalize()
	if st.def != want {
		t.Fatalf("stored %+v, want %+v", st.def, want)
	}
	started := st.startsAt
	// The same definition again: nothing changes, nothing reported.
	if err := a.s.Register(ctx, v1, nop); err != nil {
		t.Fatal(err)
	}
	if n := len(ev.of(EventFollowed)); n != 0 {
		t.Fatalf("%d followed events for an identical registration", n)
	}
	// An operator pauses it; registration leaves that alone.
	if err := a.s.Pause(ctx, "report", "audit", "ops"); err != nil {
		t.Fatal(err)
	}
	// A higher version replaces it, keeping starts_at while spec and zone
	// are the same.
	v2 := v1
	v2.Version, v2.Overlap, v2.Retry = 2, OverlapBufferOne, RetryPolicy{MaxAttempts: 5, Backoff: time.Second}
	if err := a.s.Register(ctx, v2, nop); err != nil {
		t.Fatal(err)
	}
	st, _ = loadSchedule(ctx, a.s.q, "report")
	if st.def.Version != 2 || st.def.Overlap != OverlapBufferOne || st.def.Retry.MaxAttempts != 5 || !st.startsAt.Equal(started) {
		t.Fatalf("after v2: %+v starts %v (was %v)", st.def, st.startsAt, started)
	}
	if !st.paused || st.pausedNote != "audit" || st.pausedBy != "ops" {
		t.Fatalf("registration changed the pause state: paused %v note %q by %q", st.paused, st.pausedNote, st.pausedBy)
	}
	// A lower version (the old deployment, still running) follows v2.
	b := newInstance(t, db, "b", Config{}, ev)
	if err := b.s.Register(ctx, v1, nop); err != nil {
		t.Fatal(err)
	}
	// An equal version with other settings follows the stored one too.
	v2b := v2
	v2b.Spec = "0 10 * * *"
	if err := b.s.Register(ctx, v2b, nop); err != nil {
		t.Fatal(err)
	}
	st, _ = loadSchedule(ctx, a.s.q, "report")
	if st.def.Version != 2 || st.def.Spec != "0 9 * * *" {
		t.Fatalf("stored %+v, want version 2 unchanged", st.def)
	}
	if f := ev.of(EventFollowed); len(f) != 2 || !strings.Contains(f[0].Reason, "version 1") || !strings.Contains(f[1].Reason, "version 2") {
		t.Fatalf("followed events %+v", f)
	}
	// The same version with another spec: the warning names the field, both
	// values, and says to raise Version.
	if r := ev.of(EventFollowed)[1].Reason; !strings.Contains(r, `Spec ("0 10 * * *" here, "0 9 * * *" stored)`) || !strings.Contains(r, "raise Definition.Version (to 3)") {
		t.Errorf("same version, other spec: %q; want the field named and Version to raise", r)
	}
	if r := ev.of(EventFollowed)[0].Reason; !strings.Contains(r, "Overlap") || !strings.Contains(r, "Retry.MaxAttempts") || strings.Contains(r, "Spec (") {
		t.Errorf("older version: %q; want Overlap and Retry.MaxAttempts named, not Spec", r)
	}
	// A new spec moves starts_at: its earlier instants were never due.
	v3 := v2
	v3.Version, v3.Spec = 3, "0 11 * * *"
	if err := a.s.Register(ctx, v3, nop); err != nil {
		t.Fatal(err)
	}
	st, _ = loadSchedule(ctx, a.s.q, "report")
	if st.def.Spec != "0 11 * * *" || !st.startsAt.After(started) {
		t.Fatalf("v3: %+v starts %v (was %v)", st.def, st.startsAt, started)
	}
}

// Blue/green: two deployments register different definitions concurrently,
// again and again; the stored definition ends as the higher version's and
// never moves down.
func TestRegisterBlueGreenNoFlapping(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	quiet := Config{Logger: testLogger(t)}
	blue := newInstance(t, db, "blue", quiet, nil)
	green := newInstance(t, db, "green", quiet, nil)
	blue.s.log = discard
	green.s.log = discard
	for round := range 100 {
		name := fmt.Sprintf("job-%d", round)
		oldDef := Definition{Name: name, Spec: "*/5 * * * *", Version: 1}
		newDef := Definition{Name: name, Spec: "*/10 * * * *", Version: 2, CatchUp: CatchUpNone}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var seen []int
		wg.Add(2)
		watched := make(chan struct{})
		go func() { // watches the stored version
			defer close(watched)
			for {
				var v int
				err := db.Pool.QueryRow(ctx, `SELECT version FROM pgclaim_schedules WHERE name = $1`, name).Scan(&v)
				if err == nil && (len(seen) == 0 || seen[len(seen)-1] != v) {
					seen = append(seen, v)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
		errs := make([]error, 2)
		for i, in := range []*instance{blue, green} {
			def := oldDef
			if i == 1 {
				def = newDef
			}
			go func() {
				defer wg.Done()
				for range 3 { // restarts
					if err := in.s.Register(ctx, def, nop); err != nil {
						errs[i] = err
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-watched
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		st, err := loadSchedule(ctx, blue.s.q, name)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := newDef.normalize()
		if st.def != want {
			t.Fatalf("round %d: stored %+v, want the version 2 definition", round, st.def)
		}
		for i := 1; i < len(seen); i++ {
			if seen[i] < seen[i-1] {
				t.Fatalf("round %d: stored version went %v", round, seen)
			}
		}
	}
}

func TestRegisterBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "a", Config{}, nil)
	good := Definition{Name: "x", Spec: "* * * * *", Version: 1}
	for _, c := range []struct {
		mut   func(*Definition)
		field string
	}{
		{func(d *Definition) { d.Name = "" }, "Definition.Name"},
		{func(d *Definition) { d.Name = "report\x1b]0;pwned\x07" }, "Definition.Name"},
		{func(d *Definition) { d.Name = "report\nsecond line" }, "Definition.Name"},
		{func(d *Definition) { d.Name = "evil\u202egnp.exe" }, "Definition.Name"},
		{func(d *Definition) { d.Name = " padded" }, "Definition.Name"},
		{func(d *Definition) { d.Name = strings.Repeat("x", MaxNameLen+1) }, "Definition.Name"},
		{func(d *Definition) { d.Spec = "" }, "Definition.Spec"},
		{func(d *Definition) { d.Spec = "61 * * * *" }, "Definition.Spec"},
		{func(d *Definition) { d.Spec = "every day" }, "Definition.Spec"},
		{func(d *Definition) { d.Spec = "0 9 31 2 *" }, "Definition.Spec"},
		{func(d *Definition) { d.Spec = "0 9 * * MON-FRU" }, "Definition.Spec"},
		{func(d *Definition) { d.TimeZone = "Mars/Olympus" }, "Definition.TimeZone"},
		{func(d *Definition) { d.Version = 0 }, "Definition.Version"},
		{func(d *Definition) { d.Version = -1 }, "Definition.Version"},
		{func(d *Definition) { d.CatchUp = "some" }, "Definition.CatchUp"},
		{func(d *Definition) { d.CatchUpWindow = -time.Second }, "Definition.CatchUpWindow"},
		{func(d *Definition) { d.CatchUpCap = -1 }, "Definition.CatchUpCap"},
		{func(d *Definition) { d.Overlap = "cancel" }, "Definition.Overlap"},
		{func(d *Definition) { d.Jitter = -1 }, "Definition.Jitter"},
		{func(d *Definition) { d.Retry.MaxAttempts = -1 }, "Definition.Retry.MaxAttempts"},
		{func(d *Definition) { d.Retry.Backoff = -1 }, "Definition.Retry.Backoff"},
		{func(d *Definition) { d.Retry.Backoff, d.Retry.MaxBackoff = time.Minute, time.Second }, "Definition.Retry.MaxBackoff"},
		{func(d *Definition) { d.ExpectedDuration = -1 }, "Definition.ExpectedDuration"},
		{func(d *Definition) { d.LateAfter = -1 }, "Definition.LateAfter"},
		{func(d *Definition) { d.Lease = time.Millisecond }, "Definition.Lease"},
	} {
		d := good
		c.mut(&d)
		err := in.s.Register(ctx, d, nop)
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: "+c.field+": ") {
			t.Errorf("%+v: got %v, want an error naming %s (ErrInvalid)", d, err, c.field)
		}
	}
	if err := in.s.Register(ctx, good, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "job") {
		t.Errorf("nil job: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgclaim_schedules`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d schedules stored (%v) after bad input, want none", n, err)
	}
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil pool: %v", err)
	}
	if _, err := New(db.Pool, Config{Grace: -1}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Config.Grace") {
		t.Errorf("negative grace: %v", err)
	}
	if err := in.s.Pause(ctx, "nope", "", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("pause unknown: %v", err)
	}
	if _, _, err := in.s.Trigger(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("trigger unknown: %v", err)
	}
}

// Register before Migrate says what to do.
func TestRegisterBeforeMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabaseFrom(t, pgtest.Template{Name: "schedule_unmigrated", Unmigrated: true})
	s, err := New(db.Pool, Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Register(context.Background(), Definition{Name: "x", Spec: "0 9 * * *", Version: 1}, nop)
	if err == nil || !strings.Contains(err.Error(), "run 'pgclaim migrate up' or call pgclaim.Migrate first") {
		t.Fatalf("Register before Migrate: %v; want it to say to migrate", err)
	}
	if err := s.Pause(context.Background(), "x", "n", "b"); err == nil || !strings.Contains(err.Error(), "pgclaim migrate up") {
		t.Errorf("Pause before Migrate: %v; want it to say to migrate", err)
	}
}

// A spec that does not parse is named once in the error.
func TestBadSpecNamedOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	in := newInstance(t, db, "a", Config{}, nil)
	err := in.s.Register(context.Background(), Definition{Name: "x", Spec: "0 9 * *", Version: 1}, nop)
	if err == nil || strings.Count(err.Error(), `"0 9 * *"`) != 1 || strings.Count(err.Error(), "Spec") != 1 {
		t.Errorf("bad spec: %v; want the field and the spec once", err)
	}
}
