package schedule

// Run's loop: it sleeps until the next instant of any schedule, shares the
// schedules due at one moment out among the instances with room, starts a
// runner (holder.go) for each schedule it takes, and hears the runners'
// results, the kicks of notifications and the polls.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/internal/listen"
)

// result is what a holder goroutine reports to Run's loop.
type result struct {
	name     string
	wake     time.Time // database time of the next wake-up; zero: none but polls
	handBack bool      // an attempt was handed back at shutdown
	err      error     // a failure no retry cures: Run ends with it
	refused  bool      // the database refused a connection (see refusals)
	readOnly bool      // a read-only server refused a statement (readonly.go)
}

// Run runs the registered schedules until ctx ends: it sleeps until the
// next instant of any of them, then runs what is due. It returns ctx's
// error after the runs in flight have ended (their contexts are cancelled
// with ctx). Run must not be called twice at once. Behind a connection
// pooler without Config.LeaseLocks it returns an error wrapping
// gate.ErrPooler at once: session locks cannot be trusted there. A
// privilege the role lacks (SQLSTATE 42501) ends it with an error naming
// the privilege and the statement that grants it.
func (s *Scheduler) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("schedule: Run is already running")
	}
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
	}()
	defer s.locks.close()
	if err := s.locks.check(ctx); err != nil {
		return err
	}
	defer s.zombies.Wait() // after the holders below have returned
	// A holder's failure that no retry cures ends Run with it.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)

	kicks := make(chan string, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	if !s.cfg.LeaseLocks {
		sub := listen.Subscribe(s.pool, notifyChannel, listen.Options{Payloads: true, Logger: s.log})
		s.sub.Store(sub)
		defer func() { s.sub.Store(nil); sub.Close() }()
		wg.Add(1)
		go func() { defer wg.Done(); s.heed(lctx, sub, kicks) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.retain(lctx) }()

	results := make(chan result)
	active := map[string]bool{}
	wake := map[string]time.Time{} // zero: none but polls and kicks
	kicked := map[string]bool{}
	again := map[string]bool{} // kicked while being attended: attend once more
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var askedTaken time.Time      // the last untaken
	leftOver := map[string]bool{} // due, not tried by the last shareOut
	for {
		entries := s.snapshot()
		now := s.dbNow()
		next := time.Time{}
		start := func(e *entry, h held) {
			delete(kicked, e.name)
			active[e.name] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := s.attend(ctx, e, h)
				select {
				case results <- r:
				case <-ctx.Done():
				}
			}()
		}
		var due []*entry // due at their wake-up: attended after the kicked and new
		for _, e := range entries {
			if active[e.name] {
				if kicked[e.name] {
					// The runner sees the poke if it is waiting on a run;
					// an attend that is past its look and about to return
					// does not, so the schedule is attended again once it
					// has returned.
					delete(kicked, e.name)
					again[e.name] = true
					select {
					case e.poke <- struct{}{}:
					default:
					}
				}
				continue
			}
			w, known := wake[e.name]
			if !known || kicked[e.name] {
				if len(active) < s.cfg.MaxConcurrent {
					start(e, nil)
				}
				continue // else looked at once an attend returns
			}
			if !w.IsZero() && !w.After(now) {
				due = append(due, e)
				continue
			}
			if !w.IsZero() && (next.IsZero() || w.Before(next)) {
				next = w
			}
		}
		if room := s.cfg.MaxConcurrent - len(active); room > 0 && len(due) > 1 {
			// Schedules left over by an earlier share-out (this instance
			// had no room for them then) may have run since: asked first.
			if slices.ContainsFunc(due, func(e *entry) bool { return leftOver[e.name] }) && time.Since(askedTaken) >= takenSpacing {
				askedTaken = time.Now()
				due = s.untaken(ctx, due, wake)
			}
			due = s.shareOut(ctx, due, room, wake, start)
			clear(leftOver)
			for _, e := range due {
				leftOver[e.name] = true
			}
			for _, e := range entries {
				if w := wake[e.name]; !active[e.name] && w.After(now) && (next.IsZero() || w.Before(next)) {
					next = w
				}
			}
		}
		if room := s.cfg.MaxConcurrent - len(active); room > 0 && len(due) > room && time.Since(askedTaken) >= takenSpacing {
			askedTaken = time.Now()
			due = s.untaken(ctx, due, wake)
			for _, e := range entries {
				if w := wake[e.name]; !active[e.name] && w.After(now) && (next.IsZero() || w.Before(next)) {
					next = w
				}
			}
		}
		for _, e := range due {
			if len(active) >= s.cfg.MaxConcurrent {
				break // looked at once an attend returns
			}
			start(e, nil)
		}
		d := time.Hour
		if !next.IsZero() {
			d = max(next.Sub(now), time.Millisecond)
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-timer.C:
		case <-s.changed:
		case name := <-kicks:
			s.mu.Lock()
			_, ours := s.entries[name]
			s.mu.Unlock()
			if ours {
				kicked[name] = true
			}
		case <-poll.C:
			for _, name := range s.poll(ctx, entries, nil) {
				kicked[name] = true
			}
		case r := <-results:
			if r.err != nil {
				fail(r.err)
			}
			if !r.refused {
				s.refusals.over(ctx, s)
			}
			if !r.readOnly && r.err == nil {
				s.writer(ctx)
			}
			delete(active, r.name)
			wake[r.name] = r.wake
			if again[r.name] {
				delete(again, r.name)
				kicked[r.name] = true
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// snapshot returns the schedules registered so far.
func (s *Scheduler) snapshot() []*entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries := make([]*entry, 0, len(s.entries))
	for _, e := range s.entries {
		entries = append(entries, e)
	}
	return entries
}
