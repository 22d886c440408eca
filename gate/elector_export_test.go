package gate

import (
	"errors"
)

// Crash simulates the death of this instance's process while it leads: the
// leadership ends at once (its context is cancelled), the term is left open
// and, for the lease variant, the lease is no longer renewed; for the
// advisory variant the session is closed without closing the term (at once,
// or under Run once fn has returned), so the server releases the lock as it
// would for a dead process. It reports whether there was a term.
func (e *Elector) Crash() bool {
	t := e.cur.Load()
	if t == nil {
		return false
	}
	t.crashed.Store(true)
	t.stepDown(errors.New("gate: simulated crash"))
	t.stopWatch()
	return true
}
