package lockcore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ReleaseTimeout bounds a release after a job (an unlock, an outcome write,
// a term close), which goes ahead even when the caller's context has ended.
const ReleaseTimeout = 10 * time.Second

// ReleaseContext returns the context a release runs under: ctx's values,
// not its cancellation, and a deadline ReleaseTimeout from now.
func ReleaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
}

// Outcome is how a job run under a lock ended, as pgclaim records it.
type Outcome string

// Outcomes of a run.
const (
	Succeeded Outcome = "succeeded" // the job returned nil
	Failed    Outcome = "failed"    // the job returned an error
	Lost      Outcome = "lost"      // the lock was lost while the job ran
	Abandoned Outcome = "abandoned" // the caller's context ended, or the job panicked
)

// Classify says how a job that returned err ended. ctx is the caller's
// context: a job that failed after it ended was abandoned rather than
// failed.
func Classify(ctx context.Context, err error) Outcome {
	switch {
	case err == nil:
		return Succeeded
	case ctx.Err() != nil:
		return Abandoned
	default:
		return Failed
	}
}

// PanicError is the error recorded for a job that panicked.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("gate: job panicked: %v", e.Value) }

// Held is a lock held while a job runs under it.
type Held interface {
	// Context is cancelled when the lock is found lost, with the loss as
	// its cause; it may be a context that never ends.
	Context() context.Context
	// Release ends the hold once the job has returned: it stops confirming
	// the lock and gives it up, recording out and jobErr where the lock
	// keeps a record. lost is non-nil when the lock turned out lost, while
	// the job ran or at the release: the run is then Lost. When the
	// keeper reported the loss, lost is the cause Context was cancelled
	// with. err is a failure of the release the caller should see.
	Release(ctx context.Context, out Outcome, jobErr error) (lost, err error)
}

// Result is how a job run under a lock went.
type Result struct {
	Outcome  Outcome
	Duration time.Duration // how long the job ran
	JobErr   error         // the job's error; a *PanicError when it panicked
	Lost     error         // why the lock was lost; nil when held to the end
	// ReleaseErr is a release failure to show the caller (Held.Release).
	ReleaseErr error
	// Panicked reports a panic, whose value is Panic: the protocol reports
	// the run, then re-raises it.
	Panicked bool
	Panic    any
}

// Err is the error the run ends with: the job's, the loss (with the job's
// error when it is not the loss itself: "<lost> (job: <err>)"), and a
// release failure joined to either.
func (r Result) Err() error {
	err := r.JobErr
	if r.Lost != nil {
		err = r.Lost
		if r.JobErr != nil && !errors.Is(r.JobErr, r.Lost) {
			err = fmt.Errorf("%w (job: %w)", r.Lost, r.JobErr)
		}
	}
	if r.ReleaseErr != nil {
		return errors.Join(err, r.ReleaseErr)
	}
	return err
}

// Run runs fn while h is held, and releases h. fn's context has ctx's
// values and is cancelled when ctx ends or h is lost (with the cause). A
// panic in fn is recovered: the run is Abandoned with a *PanicError, h is
// released, and the Result carries the panic for the caller to re-raise
// once it has reported the run.
func Run(ctx context.Context, h Held, fn func(context.Context) error) (r Result) {
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := func() bool { return false }
	if lockCtx := h.Context(); lockCtx.Done() != nil {
		stop = context.AfterFunc(lockCtx, func() { cancel(context.Cause(lockCtx)) })
	}
	start := time.Now()
	r.Panicked, r.Panic, r.JobErr = call(runCtx, fn)
	r.Duration = time.Since(start)
	stop()
	cancel(nil)

	r.Outcome = Classify(ctx, r.JobErr)
	if r.Panicked {
		r.Outcome, r.JobErr = Abandoned, &PanicError{Value: r.Panic}
	}
	rctx, rcancel := ReleaseContext(ctx)
	defer rcancel()
	r.Lost, r.ReleaseErr = h.Release(rctx, r.Outcome, r.JobErr)
	if r.Lost != nil {
		r.Outcome = Lost
	}
	return r
}

// call calls fn and recovers a panic.
func call(ctx context.Context, fn func(context.Context) error) (panicked bool, p any, err error) {
	defer func() {
		if v := recover(); v != nil {
			panicked, p = true, v
		}
	}()
	return false, nil, fn(ctx)
}
