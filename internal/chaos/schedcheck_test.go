package chaos

import (
	"testing"
	"time"
)

// TestSchedStoppedAllowsWritesInFlight: a SIGSTOPped runner's write that
// the server took within its lease (sent just before the stop) is partial
// work, not a violation; a write or a success the server took once the
// lease had expired is.
func TestSchedStoppedAllowsWritesInFlight(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 15, 6, 36, 0, time.UTC)
	k := runKey{schedule: "chaos-s/lease/20", instant: t0.Add(-2 * time.Second).UnixMicro()}
	s := stop{hit: hit{holder: "i3#0", midRun: true, at: t0.Add(430 * time.Millisecond)}, to: t0.Add(5419 * time.Millisecond)}
	for _, tc := range []struct {
		name       string
		effect     time.Time
		finished   time.Time // zero: the attempt was taken over
		violations int
	}{
		{name: "effect in flight at the stop", effect: t0.Add(614 * time.Millisecond)},
		{name: "effect in flight, success in flight", effect: t0.Add(614 * time.Millisecond), finished: t0.Add(650 * time.Millisecond)},
		{name: "effect after the resume", effect: s.to.Add(20 * time.Millisecond), violations: 1},
		{name: "effect in flight, success after the resume", effect: t0.Add(614 * time.Millisecond), finished: s.to.Add(30 * time.Millisecond), violations: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &schedData{runs: map[runKey]*schedRun{}, attempts: map[runKey][]schedWrite{}, effects: map[runKey][]schedWrite{}}
			d.attempts[k] = []schedWrite{{attempt: 1, fence: 19999, instance: "i3#0", at: t0.Add(-1500 * time.Millisecond)}}
			d.effects[k] = []schedWrite{{attempt: 1, fence: 19999, instance: "i3#0", at: tc.effect}}
			r := &schedRun{instant: time.UnixMicro(k.instant), state: "succeeded", attempt: 1, fence: 19999, hasFen: true}
			if tc.finished.IsZero() {
				// Taken over: attempt 2 started after the lease expired and succeeded.
				d.attempts[k] = append(d.attempts[k], schedWrite{attempt: 2, fence: 20100, instance: "i1#0", at: s.at.Add(2500 * time.Millisecond)})
				r.attempt, r.fence, r.finished = 2, 20100, s.at.Add(3*time.Second)
			} else {
				r.finished = tc.finished
			}
			r.hasFinished = true
			d.runs[k] = r
			c := &checker{p: checkParams{schedLease: 2 * time.Second, stops: []stop{s}}}
			ck, n := c.schedStopped(d)
			if n != 1 || ck.Violations != tc.violations {
				t.Fatalf("checked %d, violations %d (want 1, %d): %v", n, ck.Violations, tc.violations, ck.Examples)
			}
		})
	}
}
