package chaos

import (
	"testing"
	"time"
)

// TestSchedStopped: a SIGSTOPped runner's write that the server took
// within the lease the database had granted (sent just before the stop, or
// after a renewal the starved server ran late) is partial work, not a
// violation; a write the server took after that lease expired is, and so is
// a success with a fence a later attempt superseded.
func TestSchedStopped(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 15, 6, 36, 0, time.UTC)
	k := runKey{schedule: "chaos-s/lease/20", instant: t0.Add(-2 * time.Second).UnixMicro()}
	s := stop{hit: hit{holder: "i3#0", midRun: true, at: t0.Add(430 * time.Millisecond)}, to: t0.Add(5419 * time.Millisecond)}
	const fence, next = 19999, 20100
	for _, tc := range []struct {
		name       string
		lease      time.Time // the latest lease_until granted to fence
		effect     time.Time
		finished   time.Time // zero: taken over by the next attempt, which succeeded
		violations int
	}{
		{name: "effect in flight at the stop", lease: s.at.Add(1500 * time.Millisecond), effect: t0.Add(614 * time.Millisecond)},
		{name: "effect after the lease expired", lease: s.at.Add(1500 * time.Millisecond), effect: s.to.Add(20 * time.Millisecond), violations: 1},
		{name: "effect within a lease a late renewal extended", lease: s.to.Add(150 * time.Millisecond), effect: s.to.Add(40 * time.Millisecond)},
		{name: "in-flight effect, then completed, not taken over", lease: s.at.Add(1500 * time.Millisecond), effect: t0.Add(614 * time.Millisecond), finished: s.to.Add(30 * time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &schedData{runs: map[runKey]*schedRun{}, attempts: map[runKey][]schedWrite{}, effects: map[runKey][]schedWrite{},
				leases: map[runKey]map[int64]time.Time{k: {fence: tc.lease}}}
			d.attempts[k] = []schedWrite{{attempt: 1, fence: fence, instance: "i3#0", at: t0.Add(-1500 * time.Millisecond)}}
			d.effects[k] = []schedWrite{{attempt: 1, fence: fence, instance: "i3#0", at: tc.effect}}
			r := &schedRun{instant: time.UnixMicro(k.instant), state: "succeeded", attempt: 1, fence: fence, hasFen: true, hasFinished: true, finished: tc.finished}
			if tc.finished.IsZero() {
				d.attempts[k] = append(d.attempts[k], schedWrite{attempt: 2, fence: next, instance: "i1#0", at: s.to.Add(time.Second)})
				r.attempt, r.fence, r.finished = 2, next, s.to.Add(1500*time.Millisecond)
			}
			d.runs[k] = r
			c := &checker{p: checkParams{schedLease: 2 * time.Second, stops: []stop{s}}}
			ck, n := c.schedStopped(d)
			if n != 1 || ck.Violations != tc.violations {
				t.Fatalf("checked %d, violations %d (want 1, %d): %v", n, ck.Violations, tc.violations, ck.Examples)
			}
		})
	}
	t.Run("taken over, then completed with the old fence", func(t *testing.T) {
		d := &schedData{runs: map[runKey]*schedRun{}, attempts: map[runKey][]schedWrite{}, effects: map[runKey][]schedWrite{},
			leases: map[runKey]map[int64]time.Time{k: {fence: s.at.Add(time.Second), next: s.to.Add(3 * time.Second)}}}
		d.attempts[k] = []schedWrite{{attempt: 1, fence: fence, instance: "i3#0", at: t0.Add(-1500 * time.Millisecond)},
			{attempt: 2, fence: next, instance: "i1#0", at: s.at.Add(2500 * time.Millisecond)}}
		d.runs[k] = &schedRun{instant: time.UnixMicro(k.instant), state: "succeeded", attempt: 1, fence: fence, hasFen: true, hasFinished: true, finished: s.to.Add(50 * time.Millisecond)}
		c := &checker{p: checkParams{schedLease: 2 * time.Second, stops: []stop{s}}}
		if ck, _ := c.schedStopped(d); ck.Violations != 1 {
			t.Fatalf("violations %d, want 1: %v", ck.Violations, ck.Examples)
		}
	})
}

// A stall covers the part of an interval it overlaps, once.
func TestStalledWithin(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := func(from, to int) span {
		return span{at.Add(time.Duration(from) * time.Second), at.Add(time.Duration(to) * time.Second)}
	}
	stalls := []span{s(-3, -1), s(1, 3), s(4, 6), s(9, 12)}
	for _, c := range []struct {
		from, to int
		want     time.Duration
	}{
		{0, 10, 5 * time.Second},
		{2, 5, 2 * time.Second},
		{-2, 0, time.Second},
		{6, 9, 0},
		{13, 20, 0},
	} {
		if got := stalledWithin(stalls, at.Add(time.Duration(c.from)*time.Second), at.Add(time.Duration(c.to)*time.Second)); got != c.want {
			t.Errorf("stalledWithin [%d s, %d s]: %s, want %s", c.from, c.to, got, c.want)
		}
	}
}
