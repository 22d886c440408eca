package schedule

// The database's clock as the host sees it: every due decision reads
// now() from the server, but an instance sleeps until an instant by its
// own clock, so it keeps an estimate of the difference.

import (
	"sync"
	"time"
)

// dbClock estimates the database's time from the host's clock and the
// database times its statements read. A statement's now() is taken
// somewhere between its sending and its answer, so a sample is as good as
// its round trip is short: one that waited for a pooled connection or ran
// long on a busy server would put the estimate off by up to half of that
// (an instance waking tens of milliseconds after an instant while the
// others share it out). The estimate therefore comes from the shortest
// recent round trip; a sample replaces it when its round trip is at most
// twice as long, plus a millisecond for each second the estimate has been
// kept (so a clock that drifts or is set is followed).
type dbClock struct {
	mu     sync.Mutex
	offset time.Duration // database time minus host time
	rtt    time.Duration // the round trip offset came from; 0: no sample yet
	at     time.Time     // when it came
}

// now returns the database's time, as estimated.
func (c *dbClock) now() time.Time {
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return time.Now().Add(off).UTC()
}

// observe takes the database time db read by a statement sent at sent and
// answered now.
func (c *dbClock) observe(sent, db time.Time) {
	if db.IsZero() {
		return
	}
	now := time.Now()
	rtt := max(now.Sub(sent), time.Microsecond)
	off := db.Sub(sent.Add(rtt / 2))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rtt > 0 && rtt > 2*c.rtt+now.Sub(c.at)/1000 {
		return
	}
	c.offset, c.rtt, c.at = off, rtt, now
}
