package lockcore

import (
	"context"
	"errors"
	"testing"
)

// held is a Held whose loss the test triggers.
type held struct {
	ctx      context.Context
	lose     context.CancelCauseFunc
	lost     error // returned by Release
	released []Outcome
}

func newHeld() *held {
	h := &held{}
	h.ctx, h.lose = context.WithCancelCause(context.Background())
	return h
}

func (h *held) Context() context.Context { return h.ctx }

func (h *held) Release(ctx context.Context, out Outcome, _ error) (error, error) {
	if _, ok := ctx.Deadline(); !ok {
		panic("release without a deadline")
	}
	h.released = append(h.released, out)
	return h.lost, nil
}

// Run classifies and releases once: a job's error is Failed, a job
// returning after the caller's context ended is Abandoned, a panic is
// Abandoned with a *PanicError and handed back, and a loss makes the run
// Lost with the job's error kept beside it.
func TestRun(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")

	h := newHeld()
	if r := Run(ctx, h, func(context.Context) error { return nil }); r.Outcome != Succeeded || r.Err() != nil {
		t.Errorf("nil job: %+v", r)
	}
	if r := Run(ctx, h, func(context.Context) error { return boom }); r.Outcome != Failed || !errors.Is(r.Err(), boom) {
		t.Errorf("failing job: %+v", r)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if r := Run(cctx, h, func(ctx context.Context) error { return ctx.Err() }); r.Outcome != Abandoned {
		t.Errorf("job after its context ended: %+v", r)
	}
	r := Run(ctx, h, func(context.Context) error { panic("kaput") })
	var pe *PanicError
	if !r.Panicked || r.Panic != "kaput" || r.Outcome != Abandoned || !errors.As(r.JobErr, &pe) || pe.Error() != "gate: job panicked: kaput" {
		t.Errorf("panicking job: %+v", r)
	}
	if len(h.released) != 4 {
		t.Errorf("released %d times, want 4", len(h.released))
	}

	lost := errors.New("lost")
	h = newHeld()
	h.lost = lost
	r = Run(ctx, h, func(ctx context.Context) error {
		h.lose(lost)
		<-ctx.Done()
		if context.Cause(ctx) != lost {
			t.Errorf("job's context cause %v, want the loss", context.Cause(ctx))
		}
		return boom
	})
	if r.Outcome != Lost || !errors.Is(r.Err(), lost) || !errors.Is(r.Err(), boom) {
		t.Errorf("lost run: %+v, err %v", r, r.Err())
	}
	h = newHeld()
	h.lost = lost
	if r := Run(ctx, h, func(ctx context.Context) error { return lost }); r.Err() != lost {
		t.Errorf("job returning the loss: err %v, want the loss alone", r.Err())
	}
}
