package schedule

// Looking for work without waiting for an instant: the poll that asks the
// database which schedules need a look (a run waiting, a dead holder's run,
// a changed definition or pause), and the notifications that tell it sooner.

import (
	"context"
	"time"

	"github.com/pgclaim/pgclaim/internal/listen"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// poll asks the database which of the schedules have a run waiting for an
// instance (pending, a retry due, a dead holder's run) or a changed
// definition or pause state, and returns their names. It runs on conn (the
// listener's, at read committed: one round trip), or through the pool when
// conn is nil.
func (s *Scheduler) poll(ctx context.Context, entries []*entry, conn *store.Queries) []string {
	names := make([]string, 0, len(entries))
	keys := make([]int32, 0, len(entries))
	known := map[string]*stored{}
	var class int32
	for _, e := range entries {
		c, k := lockKey(s.cfg.Schema, e.name)
		class = c
		names = append(names, e.name)
		keys = append(keys, k)
		s.mu.Lock()
		known[e.name] = e.st
		s.mu.Unlock()
	}
	if len(names) == 0 {
		return nil
	}
	var rows []store.PollSchedulesRow
	sent := time.Now()
	read := func(q *store.Queries) error {
		var err error
		rows, err = q.PollSchedules(ctx, store.PollSchedulesParams{LeaseMode: s.cfg.LeaseLocks, LockClass: class, Names: names, LockKeys: keys})
		return err
	}
	var err error
	if conn != nil {
		err = read(conn)
	} else {
		err = s.stmts(ctx, read)
	}
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case s.reader(ctx, "", err):
		case pgerr.Refused(err):
			s.refusals.backoff(ctx, s, "", err) // reported once per episode
		default:
			s.log.WarnContext(ctx, "schedule: poll", "error", err)
		}
		return nil
	}
	var out []string
	for _, r := range rows {
		s.observe(sent, tm(r.DbNow))
		st := known[r.Name]
		if r.Work || st == nil || st.def.Version != int(r.Version) || st.paused != r.Paused {
			out = append(out, r.Name)
		}
	}
	return out
}

// notifyChannel carries the names of schedules paused, resumed, triggered
// or handed back (the statements of sql/queries send them).
const notifyChannel = "pgclaim_schedules"

// heed passes the schedule names notified on the pool's listening session
// (internal/listen, shared with every Worker and Scheduler on the pool) to
// kicks; when the session (re)connects, or notifications came faster than
// they were read, it asks the database once which schedules need a look.
// Run's loop polls through the pool every Config.PollInterval besides.
func (s *Scheduler) heed(ctx context.Context, sub *listen.Sub, kicks chan<- string) {
	send := func(name string) bool {
		select {
		case kicks <- name:
			return true
		case <-ctx.Done():
			return false
		}
	}
	everything := func() bool {
		for _, name := range s.poll(ctx, s.snapshot(), nil) {
			if !send(name) {
				return false
			}
		}
		return true
	}
	for {
		var ok bool
		select {
		case <-ctx.Done():
			return
		case name := <-sub.Notes():
			if name == "" {
				ok = everything()
			} else {
				ok = send(name)
			}
		case <-sub.Wake():
			ok = everything()
		}
		if !ok {
			return
		}
	}
}
