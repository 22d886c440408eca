package schedule

// The scheduler's one source of exclusivity: the lock that makes one
// instance at a time the runner of a schedule (a session advisory lock,
// lock_session.go, or a lease row for transaction poolers, lock_lease.go),
// and the keeper that renews a lease while it is held. Everything else
// calls it through locker and held. The mechanism is internal/lockcore's,
// as gate's is: its Sessions and Session.Watch for advisory locks, Renew
// and Validity for leases, ReleaseContext for every release.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// locker takes a schedule's lock.
type locker interface {
	// acquire takes the lock of the schedule name, valid for lease
	// without renewal (the lease locker renews it while held). It returns
	// nil, nil when another holder has it.
	acquire(ctx context.Context, name string, lease time.Duration) (held, error)
	// leases reports whether the lock is a lease (a dead holder's run is
	// taken over at its lease's expiry) rather than a session lock (at
	// once).
	leases() bool
	// check refuses a setup that cannot work (a pooler in front of
	// session locks); a database it cannot reach is not an error here.
	check(ctx context.Context) error
	// close closes what the locker keeps between runs.
	close()
}

// held is a schedule's lock while held.
type held interface {
	// lost is closed when exclusivity is lost: the session died, or the
	// lease could not be renewed in time.
	lost() <-chan struct{}
	// cause says why it was lost (nil while held).
	cause() error
	// do runs fn with queries that take effect only while the lock is
	// held: on the lock's own session (a statement there fails once the
	// session, and with it the lock, is gone), or through the pool with g
	// naming the lease, which the guarded statements check. fn's
	// statements run at READ COMMITTED, under the ctx fn is given: ctx's
	// values, bounded by the lock's validity (see validFor).
	do(ctx context.Context, fn func(ctx context.Context, q *store.Queries, g guard) error) error
	// release gives the lock up (a no-op after a loss).
	release()
	// leaseFence is the fence of a lease lock's grant (0 for a session
	// lock): a running run with an older fence was started under an
	// earlier grant.
	leaseFence() int64
	// seize makes the holder's writes fenced before its first: the
	// session lock seizes the schedule's lease row (see
	// sessionHeld.seize); a lease lock already is one. Call it before
	// anything is written under the lock.
	seize(ctx context.Context) error
	// seized is seize done by a statement of the caller's, sent at sent,
	// that seized the lease row with fence (guard fence 0); a lease lock
	// ignores it.
	seized(ctx context.Context, fence int64, sent time.Time) error
}

// guard names the lease a guarded statement checks (zero: none, the
// statement runs on the lock's session).
type guard struct {
	name  string
	fence int64
}

// lockKey is the advisory key of a schedule's lock: gate's key space,
// under a name no gate job uses; in a schema of its own (Config.Schema),
// a key of that schema's.
func lockKey(schema, name string) (class, key int32) {
	if schema != "" {
		return gate.AdvisoryKey("pgclaim.schedule:" + schema + ":" + name)
	}
	return gate.AdvisoryKey("pgclaim.schedule:" + name)
}

// LockKey returns the two-int4 session advisory key (pg_locks classid and
// objid) an instance holds while it runs or records the schedule name,
// for tools that show who holds which lock. With Config.LeaseLocks the
// lock is instead the lease row "pgclaim.schedule:NAME" of pgclaim_locks.
func LockKey(name string) (class, key int32) { return lockKey("", name) }

// lockName is a schedule's lease row name in pgclaim_locks.
func lockName(name string) string { return "pgclaim.schedule:" + name }

// validFor is how long one confirmation of a schedule's lock holds it by
// this instance's reckoning, counted from when it was sent, for a schedule
// whose Lease is lease: 9/10 of the lease (as for the run's lease, see
// keep), and for a session advisory lock at most lockcore.SessionValidity.
// Every statement run under the lock (held.do) is bounded by it, and a
// session not confirmed for that long (by a statement or by the watch's
// ping) is lost: its run is cancelled before another instance can take the
// lock (lockcore.SessionValidity states the margin) or the lease.
func validFor(lease time.Duration, session bool) time.Duration {
	v := lease - lease/10
	if session {
		v = min(v, lockcore.SessionValidity)
	}
	return v
}

// keep renews a lease of length lease (the schedule's lock, or a run's
// lease), first granted by a statement sent at sent, every lease/3 until
// the returned stop is called (lockcore.Renew). The lease counts as held
// until 9/10 of its length after the send time of the last success (a
// lockcore.Validity, on this host's monotonic clock), so a renewal's
// deadline ends before the database's expiry; a renewal that finds the
// lease gone (pgx.ErrNoRows), or none succeeding within the validity,
// calls onLost once with an error wrapping ErrLost. A renewal that failed
// otherwise is logged and retried after lease/20. Renewals run with ctx's
// values, not its cancellation. While s.stalled is set (tests), the keeper
// does nothing at all, as a stopped process would.
func (s *Scheduler) keep(ctx context.Context, what, name string, sent time.Time, lease time.Duration, renew func(context.Context) error, onLost func(error)) (stop func()) {
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k := lockcore.Renew(kctx, lockcore.RenewConfig{
		Every:    lease / 3,
		Retry:    lease / 20,
		Validity: lockcore.NewValidity(sent, lease-lease/10, nil),
		Renew: func(rctx context.Context) (bool, error) {
			if s.stalled.Load() {
				s.freeze(kctx)
				if err := rctx.Err(); err != nil {
					return false, err // the stall outlasted the validity
				}
			}
			err := renew(rctx)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		},
		OnFail: func(err error) {
			s.log.WarnContext(ctx, "schedule: renewal failed (retrying)", "schedule", name, "lease", what, "error", err)
		},
	}, func(err error) {
		switch {
		case errors.Is(err, lockcore.ErrExpired):
			onLost(fmt.Errorf("%w: the %s was not renewed in time", ErrLost, what))
		case pgerr.Permanent(err):
			onLost(fmt.Errorf("%w: the server refuses the %s's renewal: %w", ErrLost, what, pgerr.Explain(err)))
		default:
			onLost(fmt.Errorf("%w: the %s had expired or was taken over", ErrLost, what))
		}
	})
	return func() { cancel(); k.Stop() }
}

// freeze blocks while s.stalled is set (tests), or until ctx ends.
func (s *Scheduler) freeze(ctx context.Context) {
	for s.stalled.Load() && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}
