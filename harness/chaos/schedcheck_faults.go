package chaos

// What each fault allows the schedules' runs: an instance killed, one
// stopped, a schedule paused.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// schedKilled: every attempt in flight when its process was SIGKILLed is
// followed by a later attempt within the bound (a restart of Postgres
// in between excuses the bound), and its instant ends succeeded.
func (c *checker) schedKilled(d *schedData) (Check, string, error) {
	ck := Check{Name: checkSchedKilled}
	p := c.p
	var lat []time.Duration
	excused, stalled, unknown := 0, 0, 0
	for _, kill := range p.kills {
		for k, as := range d.attempts {
			for _, a := range as {
				if a.instance != kill.holder || !d.inFlight(k, a, kill.at) {
					continue
				}
				ck.Checked++
				r := d.runs[k]
				n, ok := d.next(k, a.fence)
				if !ok {
					ck.fail("%s: attempt %d (fence %d) of SIGKILLed %s never followed (run %s)", fmtKey(k), a.attempt, a.fence, kill.holder, r.stateOr())
					continue
				}
				if r == nil || r.state != "succeeded" {
					ck.fail("%s: attempt %d of SIGKILLed %s followed, but the run ended %s", fmtKey(k), a.attempt, kill.holder, r.stateOr())
				}
				l := n.at.Sub(kill.at)
				// The documented bound (schedule/doc.go) plus 5 s for a loaded
				// machine (3 s left about one short run in eight with a
				// takeover a few tens of milliseconds over, with no stall of
				// the database): a poll or the next instant after the session ends;
				// with lease locks, the lock's lease (the poll that finds it
				// expired takes the lock and the run), plus a second poll of
				// slack: a lease schedule's instances include those behind PgBouncer,
				// whose queue adds its own delay on a saturated machine.
				bound := p.schedPoll + p.period + 5*time.Second
				if schedGroup(k.schedule) == schedGroupLease {
					bound += p.schedLease + p.schedPoll
				}
				if n.attempt != a.attempt+1 {
					// The next attempt started but left no row (it
					// failed, or died, before its first write): when
					// it started is not known.
					unknown++
					continue
				}
				if l > bound {
					st := stalledWithin(p.stalls, kill.at, n.at)
					switch {
					case restartedWithin(p.restarts, kill.at.Add(-5*time.Second), n.at) || !c.otherUp(k.schedule, kill.holder, kill.at, kill.at.Add(bound)):
						excused++
					case l-st <= bound:
						stalled++
					default:
						ck.fail("%s: attempt %d of SIGKILLed %s followed by attempt %d (%s) %s after the kill, bound %s (the database stalled %s in between)",
							fmtKey(k), a.attempt, kill.holder, n.attempt, n.instance, l.Round(time.Millisecond), bound, st.Round(time.Millisecond))
					}
				}
				lat = append(lat, l)
			}
		}
	}
	slices.Sort(lat)
	s := "none"
	if len(lat) > 0 {
		s = fmt.Sprintf("p50 %s, max %s (%d past the bound excused by a Postgres restart, or no other instance of the group up; %d within it once the database's stalls in between are added)",
			lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), excused, stalled)
	}
	if unknown > 0 {
		s += fmt.Sprintf("; %d followed by an attempt after one that left no row (its start unknown, bound not checked)", unknown)
	}
	return ck, s, nil
}

func (r *schedRun) stateOr() string {
	if r == nil {
		return "unrecorded"
	}
	return r.state
}

// killedDown is how long a SIGKILLed instance is taken to be down: its
// restart comes after up to 3 s, and its start-up takes a few more.
const killedDown = 8 * time.Second

// otherUp reports whether some instance running schedule's group, other
// than the one of holder, was neither SIGKILLed nor SIGSTOPped during
// [from, to]: one that could take the run over.
func (c *checker) otherUp(schedule, holder string, from, to time.Time) bool {
	self, _, _ := strings.Cut(holder, "#")
	for _, in := range c.p.groupInstances[schedGroup(schedule)] {
		if in == self {
			continue
		}
		down := false
		for _, k := range c.p.kills {
			if strings.HasPrefix(k.holder, in+"#") && !k.at.After(to) && !k.at.Add(killedDown).Before(from) {
				down = true
			}
		}
		for _, s := range c.p.stops {
			end := s.to
			if end.IsZero() {
				end = to
			}
			if strings.HasPrefix(s.holder, in+"#") && !s.at.After(to) && !end.Before(from) {
				down = true
			}
		}
		if !down {
			return true
		}
	}
	return false
}

func restartedWithin(rs []time.Time, from, to time.Time) bool {
	for _, r := range rs {
		if !r.Before(from) && !r.After(to) {
			return true
		}
	}
	return false
}

// schedStopped: an attempt in flight when its process was SIGSTOPped for
// longer than the run's lease took no effect once the lease the database
// had granted it expired (the latest lease_until of its fence, from
// chaos_sched_leases), and, if another attempt of its instant started
// meanwhile, did not complete the run. A write the server took within the
// lease while the process was stopped was sent before the stop: partial
// work, which the other checks count as such.
func (c *checker) schedStopped(d *schedData) (Check, int) {
	ck := Check{Name: checkSchedStopped}
	// slack: the effect's stamp is read just after the statement compared
	// the lease with the clock.
	const slack = 100 * time.Millisecond
	for _, s := range c.p.stops {
		if s.to.IsZero() || s.to.Sub(s.at) <= c.p.schedLease+slack {
			continue
		}
		for k, as := range d.attempts {
			for _, a := range as {
				if a.instance != s.holder || !d.inFlight(k, a, s.at.Add(slack)) {
					continue
				}
				ck.Checked++
				until, ok := d.leases[k][a.fence]
				if !ok {
					ck.fail("%s: attempt %d (fence %d) of %s, SIGSTOPped %s: no lease of it was recorded", fmtKey(k), a.attempt, a.fence, s.holder, s.to.Sub(s.at).Round(time.Millisecond))
					continue
				}
				if e, ok := d.effect(k, a.fence); ok && e.at.After(until.Add(slack)) {
					ck.fail("%s: attempt %d (fence %d) of %s, SIGSTOPped %s, wrote its effect at %s, after its lease expired at %s",
						fmtKey(k), a.attempt, a.fence, s.holder, s.to.Sub(s.at).Round(time.Millisecond), e.at.Format("15:04:05.000"), until.Format("15:04:05.000"))
				}
				if _, superseded := d.next(k, a.fence); superseded {
					if r := d.runs[k]; r != nil && r.fence == a.fence && r.state == "succeeded" {
						ck.fail("%s: attempt %d (fence %d) of %s, SIGSTOPped %s, completed the run after a later attempt started",
							fmtKey(k), a.attempt, a.fence, s.holder, s.to.Sub(s.at).Round(time.Millisecond))
					}
				}
			}
		}
	}
	return ck, ck.Checked
}

// schedPaused: while a schedule was paused (from the pause's commit to the
// resume's start) nothing of it was recorded or started; the instants due
// meanwhile were decided at resume (the window check says how they ended).
func (c *checker) schedPaused(ctx context.Context, d *schedData) (Check, string, error) {
	ck := Check{Name: checkSchedPaused}
	rows, err := c.pool.Query(ctx, `SELECT schedule, paused_at, resumed_at FROM chaos_sched_pauses ORDER BY paused_at`)
	if err != nil {
		return ck, "", err
	}
	type pause struct {
		name   string
		p, r   time.Time
		hasEnd bool
	}
	var ps []pause
	for rows.Next() {
		var x pause
		var r *time.Time
		if err := rows.Scan(&x.name, &x.p, &r); err != nil {
			rows.Close()
			return ck, "", err
		}
		if r != nil {
			x.r, x.hasEnd = *r, true
		}
		ps = append(ps, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return ck, "", err
	}
	due, ran := 0, 0
	for _, x := range ps {
		ck.Checked++
		if !x.hasEnd {
			ck.fail("%s: paused at %s, never resumed", x.name, x.p.Format(time.TimeOnly))
			continue
		}
		for k, r := range d.runs {
			if k.schedule != x.name {
				continue
			}
			if r.created.After(x.p) && r.created.Before(x.r) {
				ck.fail("%s: recorded at %s while paused (%s to %s)", fmtKey(k), r.created.Format("15:04:05.000000"), x.p.Format("15:04:05.000000"), x.r.Format("15:04:05.000000"))
			}
			if r.hasStarted && r.started.After(x.p) && r.started.Before(x.r) {
				ck.fail("%s: attempt %d started at %s while paused (%s to %s)", fmtKey(k), r.attempt, r.started.Format("15:04:05.000000"), x.p.Format("15:04:05.000000"), x.r.Format("15:04:05.000000"))
			}
			if !r.instant.Before(x.p) && !r.instant.After(x.r) {
				due++
				if r.state == "succeeded" {
					ran++
				}
			}
		}
	}
	return ck, fmt.Sprintf("%d schedule pauses, %d instants due while paused (%d succeeded after the resume)", len(ps), due, ran), nil
}
