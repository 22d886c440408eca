package claim

import (
	"fmt"
	"time"
)

// RetryPolicy says where a row goes when its claim ends without success
// while it has attempts left, and how long it waits there before it may be
// claimed again. A Worker applies it to a row whose work failed
// (WorkerConfig.Retry), a Sweeper to a row whose claim went stale
// (SweeperConfig.Retry); both check it the same way, at construction. The
// zero value means no retry: such a row goes to the failed state.
type RetryPolicy struct {
	// State is the state a failed (worker) or stale (sweeper) row moves to
	// while Table.Attempts is below MaxAttempts; typically Config.From, so
	// that the row is claimed again. It must differ from Config.To. Needs
	// Table.Attempts. Empty: no retry.
	State string
	// MaxAttempts is the number of claims a row gets before a failure is
	// final: a row that has had MaxAttempts claims goes to the failed
	// state. Required with State.
	MaxAttempts int
	// Backoff, when positive, is how long a row moved to State after its
	// first failure waits before it may be claimed again: the move sets
	// Table.RetryAt to database time plus the wait, and claims pass over
	// the row until then. Zero: the row may be claimed again at once. Needs
	// State and Table.RetryAt; at least 1µs. A Worker's Drain does not wait
	// for such rows: it returns once nothing is claimable.
	Backoff time.Duration
	// MaxBackoff, when above Backoff, makes the wait double with each
	// further attempt, capped at MaxBackoff: with Backoff 1s and MaxBackoff
	// 1m a row waits 1s after its first claim failed, 2s after its second,
	// then 4s, 8s, … 1m. Zero: Backoff every time. Needs Backoff; must not
	// be positive and below it.
	MaxBackoff time.Duration
}

// check validates p as the field named field (for example
// "WorkerConfig.Retry") of a configuration for c's rows, and returns an
// error naming the first bad field.
func (p RetryPolicy) check(field string, c *core) error {
	t := c.t
	switch {
	case p.State != "" && p.State == c.to:
		return invalid(field+".State", fmt.Sprintf("must differ from Config.To (%q)", p.State))
	case p.MaxAttempts < 0:
		return invalid(field+".MaxAttempts", "must not be negative")
	case p.State != "" && p.MaxAttempts == 0:
		return invalid(field+".MaxAttempts", "must be positive when "+field+".State is set")
	case p.State == "" && p.MaxAttempts > 0:
		return invalid(field+".State", "must be set when "+field+".MaxAttempts is")
	case p.State != "" && t.attempts == "":
		return t.needs("Table.Attempts", t.attempts, field+".State")
	case p.Backoff < 0:
		return invalid(field+".Backoff", "must not be negative")
	case p.MaxBackoff < 0:
		return invalid(field+".MaxBackoff", "must not be negative")
	case p.MaxBackoff > 0 && p.Backoff == 0:
		return invalid(field+".Backoff", "must be positive when "+field+".MaxBackoff is")
	case p.MaxBackoff > 0 && p.MaxBackoff < p.Backoff:
		return invalid(field+".MaxBackoff", fmt.Sprintf("must not be below %s.Backoff (%v)", field, p.Backoff))
	case p.Backoff > 0 && p.State == "":
		return invalid(field+".State", "must be set when "+field+".Backoff is")
	case p.Backoff > 0 && t.retryAt == "":
		return t.needs("Table.RetryAt", t.retryAt, field+".Backoff")
	case p.Backoff > 0 && p.Backoff < time.Microsecond:
		return invalid(field+".Backoff", "must be at least 1µs")
	}
	return nil
}

// doubles reports whether the wait doubles with each attempt.
func (p RetryPolicy) doubles() bool { return p.MaxBackoff > p.Backoff }

// maxDoublings is the fewest doublings of Backoff that reach MaxBackoff,
// the most a wait is doubled (0 when it does not double): the sweeper's
// statement computes the wait with it (see Sweeper.build).
func (p RetryPolicy) maxDoublings() int {
	n := 0
	for d := p.Backoff; p.doubles() && d < p.MaxBackoff; n++ {
		if d > p.MaxBackoff/2 {
			return n + 1
		}
		d *= 2
	}
	return n
}

// wait returns how long a row that has had attempts claims (1 after its
// first failure) waits before it may be claimed again: Backoff doubled
// attempts-1 times, capped at MaxBackoff when that is above Backoff. The
// sweeper's statement computes the same (see Sweeper.build).
func (p RetryPolicy) wait(attempts int) time.Duration {
	d := p.Backoff
	for n := 1; n < attempts && d < p.MaxBackoff; n++ {
		if d > p.MaxBackoff/2 {
			return p.MaxBackoff
		}
		d *= 2
	}
	if p.doubles() {
		d = min(d, p.MaxBackoff)
	}
	return d
}
