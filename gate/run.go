package gate

import (
	"context"

	"github.com/pgclaim/pgclaim/internal/lockcore"
)

// runHeld is the one path every protocol runs a job by: fn runs as run
// while h is held (lockcore.Run: contexts merged, timed, a panic recovered,
// the outcome classified, h released), then the run is reported with
// EventFinished when finish is set, a panic is re-raised, and the run's
// error is returned (the job's; the loss, with the job's error; a release
// failure joined).
func (o *instance) runHeld(ctx context.Context, run Run, h lockcore.Held, fn Func, finish bool) error {
	r := lockcore.Run(ctx, h, func(ctx context.Context) error { return fn(ctx, run) })
	err := r.Err()
	if finish {
		o.emit(ctx, finished(run, Outcome(r.Outcome), r.Duration, err))
	}
	if r.Panicked {
		panic(r.Panic)
	}
	return err
}

// neverLost is the context of a hold that cannot be lost while the job runs.
var neverLost = context.Background()

// releaseCtx is lockcore.ReleaseContext: ctx's values, no cancellation, and
// a deadline for a release that must go ahead after ctx has ended.
func releaseCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return lockcore.ReleaseContext(ctx)
}
