package schedule

// A full server: when the database refuses connections (too many clients,
// starting up), every schedule that needed one waits a back-off that grows
// with the episode and carries jitter, so the instances of a service do not
// come back in step, and the episode is reported once, then at most every
// reportEvery, never once per schedule.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

const (
	maxBackoff  = 30 * time.Second
	reportEvery = 10 * time.Second
)

// refusals is the state of a refusal episode.
type refusals struct {
	mu       sync.Mutex
	since    time.Time // first refusal of the episode; zero: none
	reported time.Time
	count    int
}

// backoff records a refusal met while attending name and returns how long
// to wait before looking at it again: the episode's age so far, at least
// the poll interval and at most maxBackoff, plus up to half again of jitter.
func (r *refusals) backoff(ctx context.Context, s *Scheduler, name string, err error) time.Duration {
	now := time.Now()
	r.mu.Lock()
	if r.since.IsZero() {
		r.since = now
	}
	r.count++
	d := min(max(s.cfg.PollInterval, now.Sub(r.since)), maxBackoff)
	d += time.Duration(rand.Int64N(int64(d)/2 + 1))
	report := r.reported.IsZero() || now.Sub(r.reported) >= reportEvery
	count, since := r.count, r.since
	if report {
		r.reported = now
	}
	r.mu.Unlock()
	if report && ctx.Err() == nil {
		s.emit(ctx, Event{Kind: EventRefused, Schedule: name, Holder: s.holder, Duration: d, Err: err,
			Reason: fmt.Sprintf("the database refused %d connection(s) since %s; backing off", count, since.Format(time.RFC3339))})
	}
	return d
}

// over ends an episode once a schedule was attended without a refusal.
func (r *refusals) over(ctx context.Context, s *Scheduler) {
	r.mu.Lock()
	if r.since.IsZero() {
		r.mu.Unlock()
		return
	}
	since, count := r.since, r.count
	r.since, r.reported, r.count = time.Time{}, time.Time{}, 0
	r.mu.Unlock()
	s.log.InfoContext(ctx, "schedule: connections available again", "refused", count, "for", time.Since(since).Round(time.Millisecond).String())
}
