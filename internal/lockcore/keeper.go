package lockcore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// ErrExpired is the loss a Keeper reports when its Validity ran out before a
// confirmation extended it.
var ErrExpired = errors.New("not confirmed before its validity ran out")

// ErrGone is the loss Renew reports when a renewal found the lease row
// expired or taken over.
var ErrGone = errors.New("expired or taken over")

// Validity is the instance-clock bound until which a lock is known held:
// each confirmation sent at some instant holds it for a fixed length from
// that instant (so the bound is never later than the database's view), and
// a lock not confirmed by then may be gone.
type Validity struct {
	length time.Duration

	mu      sync.Mutex
	until   time.Time
	timer   *time.Timer // calls onExpiry; nil without one
	stopped bool
}

// NewValidity returns the validity of a lock acquired by a statement sent
// at sent, holding it for length. When onExpiry is not nil, it is called
// (on its own goroutine) once the bound passes without a confirmation
// moving it, unless Stop was called first.
func NewValidity(sent time.Time, length time.Duration, onExpiry func()) *Validity {
	v := &Validity{length: length, until: sent.Add(length)}
	if onExpiry != nil {
		v.mu.Lock()
		v.timer = time.AfterFunc(time.Until(v.until), func() {
			v.mu.Lock()
			early := v.stopped || time.Now().Before(v.until)
			v.mu.Unlock()
			if !early {
				onExpiry()
			}
		})
		v.mu.Unlock()
	}
	return v
}

// Confirm extends the bound after a confirmation sent at sent.
func (v *Validity) Confirm(sent time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if u := sent.Add(v.length); u.After(v.until) {
		v.until = u
		if v.timer != nil && !v.stopped {
			v.timer.Reset(time.Until(u))
		}
	}
}

// Until returns the bound.
func (v *Validity) Until() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.until
}

// Length returns how long one confirmation holds the lock.
func (v *Validity) Length() time.Duration { return v.length }

// Stop stops the expiry call.
func (v *Validity) Stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopped = true
	if v.timer != nil {
		v.timer.Stop()
	}
}

// Keeper confirms, on its own goroutine, that a lock is still held, until it
// is stopped or finds the lock lost. Session.Watch and Renew start one.
type Keeper struct {
	stopFn func() error // a watch on a shared session (Session.Watch)
	// detachFn is stopFn without taking the session (ReleaseBatched).
	detachFn func() error
	stop     context.CancelFunc
	start    *time.Timer
	done     chan struct{}
	err      error // why the lock was lost; read after done
}

// keep starts loop after after (0: at once). loop returns nil when its
// context (ctx's, cancelled by Stop) ends, or the loss; onLost is then
// called with it, from the keeper's goroutine.
func keep(ctx context.Context, after time.Duration, loop func(stop context.Context) error, onLost func(error)) *Keeper {
	stop, cancel := context.WithCancel(ctx)
	k := &Keeper{stop: cancel, done: make(chan struct{})}
	k.start = time.AfterFunc(after, func() {
		defer close(k.done)
		if err := loop(stop); err != nil {
			k.err = err
			onLost(err)
		}
	})
	return k
}

// Stop ends the keeper and returns why the lock was lost, or nil. It must
// not be called from onLost.
func (k *Keeper) Stop() error {
	if k.stopFn != nil {
		return k.stopFn()
	}
	k.stop()
	if k.start.Stop() {
		close(k.done) // never started
		return nil
	}
	<-k.done
	return k.err
}

// Done is closed when the keeper has ended: stopped, or the lock lost.
func (k *Keeper) Done() <-chan struct{} { return k.done }

// RenewConfig configures Renew.
type RenewConfig struct {
	// Every is how often the lease is renewed.
	Every time.Duration
	// Retry is how soon a failed renewal (the database could not be
	// reached) is tried again.
	Retry time.Duration
	// Validity is confirmed by every renewal; when it runs out the lease
	// is lost (ErrExpired).
	Validity *Validity
	// Renew extends the lease once, within ctx's deadline (the validity's
	// bound); held false means the row is expired or taken over (ErrGone).
	Renew func(ctx context.Context) (held bool, err error)
	// OnFail is told of a failed renewal that will be retried. A renewal
	// refused for good is not retried: it is the loss.
	OnFail func(err error)
}

// Renew starts a Keeper renewing a lease row every c.Every until it is
// stopped, ctx ends, or the lease is lost. Renewals run with ctx's values
// (not its cancellation), each bounded by the validity. Its goroutine
// starts with the first renewal: a lease released sooner costs none. A
// renewal the server refused for good (pgerr.Permanent: a missing
// privilege) ends the lease at once: onLost gets that error, and OnFail is
// not called, since every retry until the validity ran out would fail the
// same way.
func Renew(ctx context.Context, c RenewConfig, onLost func(error)) *Keeper {
	values := context.WithoutCancel(ctx)
	return keep(ctx, c.Every, func(stop context.Context) error {
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-stop.Done():
				return nil
			case <-timer.C:
			}
			until := c.Validity.Until()
			if !time.Now().Before(until) {
				return ErrExpired
			}
			sent := time.Now()
			rctx, cancel := context.WithDeadline(values, until)
			held, err := c.Renew(rctx)
			cancel()
			next := c.Every
			switch {
			case err == nil && held:
				c.Validity.Confirm(sent)
			case err == nil:
				return ErrGone
			case pgerr.Permanent(err) && stop.Err() == nil:
				return err
			default:
				next = c.Retry
				if stop.Err() == nil {
					c.OnFail(err)
				}
			}
			timer.Reset(min(next, max(time.Until(c.Validity.Until()), 0)))
		}
	}, onLost)
}
