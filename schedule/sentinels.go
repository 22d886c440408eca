package schedule

import "errors"

// Sentinel errors besides ErrInvalid. Compare with errors.Is; returned
// errors wrap them with the schedule and instant.
var (
	// ErrLost means an attempt lost its exclusivity: the schedule's lock
	// went with its session, its lease could not be renewed, or its run was
	// taken over by another instance (a fresh fence). The attempt's context
	// is cancelled when that is seen, and its completion, if it comes
	// later, changes nothing.
	ErrLost = errors.New("schedule: exclusivity lost")

	// ErrNotFound means no schedule of that name is stored.
	ErrNotFound = errors.New("schedule: no such schedule")
)
