package gate

import "time"

// HeldError is the error Once returns when it skipped a tick because the
// job's lock is held by another run: the tick was not run, here or
// anywhere, and is not in the ledger. It carries what a caller acts on —
// the job, the instant skipped and, when the ledger shows it, the run
// holding the lock. Find it with errors.As; errors.Is(err, ErrHeld) and
// errors.Is(err, ErrSkipped) hold for it as for every held skip.
//
// A tick claimed already by another instance (the usual skip) is not a
// HeldError: it wraps ErrSkipped only. That includes a tick whose winner
// holds the lock but has not yet committed its claim when Once looks
// (instances firing one tick together): Once waits for that claim to end
// before it decides. A HeldError says the tick was not in the ledger at
// that moment; an instance firing it later, once the lock is free, may
// still claim and run it.
type HeldError struct {
	// Name is the job's name.
	Name string
	// FireAt is the instant that was skipped.
	FireAt time.Time
	// Holder is the holder of the run holding the lock, "" when unknown:
	// the lock is held by an Exclusive run of the same name (not in the
	// ledger), or the ledger could not be read.
	Holder string
	// HolderFireAt is the instant of the run holding the lock, zero when
	// Holder is "".
	HolderFireAt time.Time
	// Since is when the run holding the lock started, by database time;
	// zero when Holder is "".
	Since time.Time

	err error // the whole message, wrapping ErrHeld
}

// Error returns the message, which names the job, the instant and the
// holder when known.
func (e *HeldError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped error, which wraps ErrHeld.
func (e *HeldError) Unwrap() error { return e.err }

// SkewError is the error Once returns when it refused a tick whose instant
// is further from database time than Config.SkewTolerance: nothing was run
// or recorded. It carries the instant, the database time it was measured
// against and the tolerance. Find it with errors.As;
// errors.Is(err, ErrClockSkew) holds for it.
type SkewError struct {
	// Name is the job's name.
	Name string
	// FireAt is the instant refused.
	FireAt time.Time
	// DBNow is the database's time when the claim was refused.
	DBNow time.Time
	// Tolerance is the gate's Config.SkewTolerance (its default when zero).
	Tolerance time.Duration

	err error // the whole message, wrapping ErrClockSkew
}

// Error returns the message, which names the job, the instant, its
// distance from database time, that time and the tolerance.
func (e *SkewError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped error, which wraps ErrClockSkew.
func (e *SkewError) Unwrap() error { return e.err }

// Skew returns how far FireAt is from DBNow: positive when FireAt is ahead
// of database time.
func (e *SkewError) Skew() time.Duration { return e.FireAt.Sub(e.DBNow) }
