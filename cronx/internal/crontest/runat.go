package crontest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// BuildRunAt builds an adapter's job called name on g running fn on the
// spec "0 9 * * *" read in loc, and returns its RunAt.
type BuildRunAt func(g *gate.Gate, name string, loc *time.Location, fn gate.Func) (runAt func(context.Context, time.Time) error, err error)

// RunAt checks an adapter's RunAt: the job runs for the instant given,
// once across two instances; an instant the schedule does not have (09:00
// UTC for a 09:00 Seoul job, the zero time) is refused with
// gate.ErrInvalid naming "instant"; and the gate's skew tolerance bounds
// how far from now the instant may be.
func RunAt(t *testing.T, pkg string, build BuildRunAt) {
	seoul, err := time.LoadLocation("Asia/Seoul")
	if err != nil {
		t.Fatal(err)
	}
	y := time.Now().In(seoul).AddDate(0, 0, -1)
	yesterday := time.Date(y.Year(), y.Month(), y.Day(), 9, 0, 0, 0, seoul) // 15 to 39 hours ago

	db := pgtest.NewDatabase(t)
	var ran []gate.Run
	fn := func(_ context.Context, run gate.Run) error {
		ran = append(ran, run)
		return nil
	}
	var runAts []func(context.Context, time.Time) error
	for _, h := range []string{"a", "b"} {
		g, err := gate.New(db.NewPool(t), gate.Config{SkewTolerance: 48 * time.Hour, Holder: h})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		r, err := build(g, "push-resume", seoul, fn)
		if err != nil {
			t.Fatal(err)
		}
		runAts = append(runAts, r)
	}
	ctx := context.Background()
	if err := runAts[0](ctx, yesterday); err != nil {
		t.Fatalf("RunAt(%s) on a: %v", yesterday, err)
	}
	if err := runAts[1](ctx, yesterday); !errors.Is(err, gate.ErrSkipped) {
		t.Errorf("RunAt(%s) on b after a ran it: got %v, want gate.ErrSkipped", yesterday, err)
	}
	if len(ran) != 1 || !ran[0].FireAt.Equal(yesterday) || ran[0].Holder != "a" || ran[0].Fence == 0 {
		t.Errorf("runs %+v, want one by a for %s with a fence", ran, yesterday)
	}

	utc9 := time.Date(y.Year(), y.Month(), y.Day(), 9, 0, 0, 0, time.UTC)
	for _, at := range []time.Time{utc9, yesterday.Add(time.Minute), {}} {
		err := runAts[0](ctx, at)
		if !errors.Is(err, gate.ErrInvalid) || !strings.HasPrefix(err.Error(), pkg+": instant: ") {
			t.Errorf("RunAt(%s): got %v, want gate.ErrInvalid naming the instant", at, err)
		}
	}

	g, err := gate.New(db.Pool, gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	r, err := build(g, "push-resume-strict", seoul, fn)
	if err != nil {
		t.Fatal(err)
	}
	if err := r(ctx, yesterday); !errors.Is(err, gate.ErrClockSkew) {
		t.Errorf("RunAt(%s) with the default skew tolerance: got %v, want gate.ErrClockSkew", yesterday, err)
	}
	if len(ran) != 1 {
		t.Errorf("%d runs, want 1", len(ran))
	}
}
