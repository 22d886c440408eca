package gate

import "time"

// Tests ping quiet lock connections often, so a silent network is found in
// well under a second and the ping path runs in every test.
func init() { pingEvery = 250 * time.Millisecond }

// SetWatchAfter changes how long into a run the connection watch starts, and
// returns a function restoring it. Only for tests that run alone (not
// parallel), since runs of other tests read it.
func SetWatchAfter(d time.Duration) (restore func()) {
	old := watchAfter
	watchAfter = d
	return func() { watchAfter = old }
}
