package schedule

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

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

	// ErrRecorded means Scheduler.RunAt found the instant in the ledger
	// already (run, running, waiting, skipped, triggered or backfilled):
	// it ran nothing, and returned the run as recorded.
	ErrRecorded = errors.New("schedule: instant already recorded")

	// ErrPaused means Scheduler.RunAt found the schedule paused: no
	// attempt starts until Resume.
	ErrPaused = errors.New("schedule: paused")
)

// transient reports whether err may go away when the statement is tried
// again: anything but an error the server returned, or one of those in the
// classes that depend on the moment (40 transaction rollback, 08
// connection, 53 insufficient resources, 57 operator intervention, 25006
// read-only transaction).
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return true
	}
	switch pe.Code[:2] {
	case "40", "08", "53", "57":
		return true
	}
	return pe.Code == "25006"
}
