package schedule

import (
	"testing"
	"time"
)

// TestClockKeepsTheShortRoundTrip: a statement that waited 200 ms for a
// connection before it read now() does not move the estimate of the
// database's time by half of that (the instance would wake 100 ms off its
// instants); one with a round trip as short as the estimate's does.
func TestClockKeepsTheShortRoundTrip(t *testing.T) {
	var s Scheduler
	now := time.Now()
	s.observe(now.Add(-time.Millisecond), now.Add(-500*time.Microsecond)) // the same clock, 1 ms round trip
	if d := time.Until(s.dbNow()); d.Abs() > 5*time.Millisecond {
		t.Fatalf("after a short round trip: off by %s", d)
	}
	sent := time.Now().Add(-200 * time.Millisecond)
	s.observe(sent, sent.Add(199*time.Millisecond)) // now() read just before the answer
	if d := time.Until(s.dbNow()); d.Abs() > 5*time.Millisecond {
		t.Errorf("after a 200 ms round trip: off by %s, want the short one's estimate", d)
	}
	// A database clock 3 s ahead, read in a short round trip: followed.
	sent = time.Now().Add(-time.Millisecond)
	s.observe(sent, sent.Add(3*time.Second+500*time.Microsecond))
	if d := time.Until(s.dbNow()) - 3*time.Second; d.Abs() > 5*time.Millisecond {
		t.Errorf("after a short round trip to a clock 3 s ahead: off by %s", d)
	}
}
