package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// The schedules' checks, on the final state of pgclaim_schedule_runs and
// of the job's own tables.

type runKey struct {
	schedule string
	instant  int64 // Unix µs
}

type schedRun struct {
	instant                         time.Time
	kind, state, holder, reason     string
	attempt                         int
	fence                           int64
	created, started, finished      time.Time
	hasStarted, hasFinished, hasFen bool
}

type schedWrite struct {
	attempt  int
	fence    int64
	instance string
	at       time.Time
}

type schedData struct {
	runs     map[runKey]*schedRun
	attempts map[runKey][]schedWrite // sorted by fence, then time
	effects  map[runKey][]schedWrite
	leases   map[runKey]map[int64]time.Time // the latest lease_until the database granted each fence
}

func (d *schedData) effect(k runKey, fence int64) (schedWrite, bool) {
	for _, e := range d.effects[k] {
		if e.fence == fence {
			return e, true
		}
	}
	return schedWrite{}, false
}

// next is the first attempt of k with a fence above fence.
func (d *schedData) next(k runKey, fence int64) (schedWrite, bool) {
	for _, a := range d.attempts[k] {
		if a.fence > fence {
			return a, true
		}
	}
	return schedWrite{}, false
}

func (c *checker) loadSched(ctx context.Context) (*schedData, error) {
	d := &schedData{runs: map[runKey]*schedRun{}, attempts: map[runKey][]schedWrite{}, effects: map[runKey][]schedWrite{}, leases: map[runKey]map[int64]time.Time{}}
	rows, err := c.pool.Query(ctx, `SELECT schedule, instant, kind, state, attempt, coalesce(fence, 0), fence IS NOT NULL,
			coalesce(holder, ''), coalesce(reason, ''), created_at,
			coalesce(started_at, 'epoch'), started_at IS NOT NULL, coalesce(finished_at, 'epoch'), finished_at IS NOT NULL
		FROM pgclaim_schedule_runs WHERE schedule LIKE $1`, schedPrefix+"%")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		r := &schedRun{}
		if err := rows.Scan(&name, &r.instant, &r.kind, &r.state, &r.attempt, &r.fence, &r.hasFen, &r.holder, &r.reason,
			&r.created, &r.started, &r.hasStarted, &r.finished, &r.hasFinished); err != nil {
			rows.Close()
			return nil, err
		}
		d.runs[runKey{name, r.instant.UnixMicro()}] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for table, into := range map[string]map[runKey][]schedWrite{"chaos_sched_attempts": d.attempts, "chaos_sched_effects": d.effects} {
		rows, err := c.pool.Query(ctx, `SELECT schedule, instant, attempt, fence, instance, at FROM `+table+` ORDER BY fence, at`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var name string
			var instant time.Time
			var w schedWrite
			if err := rows.Scan(&name, &instant, &w.attempt, &w.fence, &w.instance, &w.at); err != nil {
				rows.Close()
				return nil, err
			}
			k := runKey{name, instant.UnixMicro()}
			into[k] = append(into[k], w)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	rows, err = c.pool.Query(ctx, `SELECT schedule, instant, fence, max(lease_until) FROM chaos_sched_leases GROUP BY 1, 2, 3`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var instant, until time.Time
		var fence int64
		if err := rows.Scan(&name, &instant, &fence, &until); err != nil {
			rows.Close()
			return nil, err
		}
		k := runKey{name, instant.UnixMicro()}
		if d.leases[k] == nil {
			d.leases[k] = map[int64]time.Time{}
		}
		d.leases[k][fence] = until
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

func fmtKey(k runKey) string {
	return fmt.Sprintf("%s %s", k.schedule, time.UnixMicro(k.instant).UTC().Format("15:04:05.000"))
}

func (c *checker) schedules(ctx context.Context) error {
	d, err := c.loadSched(ctx)
	if err != nil {
		return fmt.Errorf("chaos: check schedules: %w", err)
	}
	p := c.p

	// Every due instant of the window (its first instants after set-up
	// excluded, as a grace) ended succeeded.
	win := Check{Name: checkSchedWindow}
	from := p.tStart.Add(2 * p.period).Truncate(p.period)
	upto := p.tStop.Add(-p.period)
	overlapSkips, perWindow := 0, 0
	for t := from; !t.After(upto); t = t.Add(p.period) {
		perWindow++
	}
	for _, name := range p.schedules {
		for t := from; !t.After(upto); t = t.Add(p.period) {
			k := runKey{name, t.UnixMicro()}
			win.Checked++
			r := d.runs[k]
			switch {
			case r == nil:
				win.fail("%s: never recorded", fmtKey(k))
			case r.state == "succeeded":
			case r.state == "skipped" && strings.HasPrefix(r.reason, "overlap: "):
				overlapSkips++
				win.fail("%s: skipped (%s); the schedules buffer every overlapping instant", fmtKey(k), r.reason)
			default:
				win.fail("%s: ended %s at attempt %d (%s)", fmtKey(k), r.state, r.attempt, r.reason)
			}
		}
	}

	// Exactly one effect per succeeded instant, with its fence; no effect
	// of an instant the ledger lacks, or above its fence.
	eff := Check{Name: checkSchedEffects}
	zomb := Check{Name: checkSchedZombies}
	partial, retried := 0, 0
	states := map[string]int{}
	for k, r := range d.runs {
		states[r.state]++
		if r.attempt > 1 {
			retried++
		}
		if r.state != "succeeded" {
			continue
		}
		eff.Checked++
		zomb.Checked++
		n := 0
		for _, e := range d.effects[k] {
			if e.fence == r.fence {
				n++
			}
		}
		if n != 1 {
			eff.fail("%s: succeeded with fence %d, %d effects with that fence", fmtKey(k), r.fence, n)
		}
		if as := d.attempts[k]; len(as) > 0 && as[len(as)-1].fence != r.fence {
			last := as[len(as)-1]
			zomb.fail("%s: succeeded with fence %d (%s) but attempt %d with fence %d (%s) started after it",
				fmtKey(k), r.fence, r.holder, last.attempt, last.fence, last.instance)
		}
	}
	for k, es := range d.effects {
		r := d.runs[k]
		for _, e := range es {
			switch {
			case r == nil:
				eff.fail("%s: effect (fence %d, %s) of an instant the ledger lacks", fmtKey(k), e.fence, e.instance)
			case e.fence > r.fence:
				eff.fail("%s: effect with fence %d (%s) above the run's fence %d", fmtKey(k), e.fence, e.instance, r.fence)
			case e.fence != r.fence || r.state != "succeeded":
				partial++
			}
		}
	}

	// Attempts of one instant one after the other: each attempt's last
	// write lies before the next attempt's first.
	excl := Check{Name: checkSchedExclusive}
	for k, as := range d.attempts {
		excl.Checked++
		for i := 1; i < len(as); i++ {
			a, b := as[i-1], as[i]
			if a.fence == b.fence || a.attempt >= b.attempt {
				excl.fail("%s: attempts %d (fence %d, %s) and %d (fence %d, %s) not in order", fmtKey(k), a.attempt, a.fence, a.instance, b.attempt, b.fence, b.instance)
				continue
			}
			last := a.at
			if e, ok := d.effect(k, a.fence); ok {
				last = e.at
			}
			if !last.Before(b.at) {
				excl.fail("%s: attempt %d (fence %d, %s) wrote at %s, after attempt %d (fence %d, %s) started at %s",
					fmtKey(k), a.attempt, a.fence, a.instance, last.Format("15:04:05.000000"), b.attempt, b.fence, b.instance, b.at.Format("15:04:05.000000"))
			}
		}
	}

	killed, latencies, err := c.schedKilled(d)
	if err != nil {
		return err
	}
	stopped, stoppedN := c.schedStopped(d)
	paused, pauseStat, err := c.schedPaused(ctx, d)
	if err != nil {
		return err
	}
	c.checks = append(c.checks, win, eff, excl, zomb, killed, stopped, paused)

	groups := map[string]bool{}
	for _, n := range p.schedules {
		groups[schedGroup(n)] = true
	}
	var gs []string
	for g := range groups {
		gs = append(gs, g)
	}
	sort.Strings(gs)
	c.stat("schedules", "%d one-%s schedules (groups %s), window %d instants each (%s to %s)",
		len(p.schedules), p.period, strings.Join(gs, ", "), perWindow, from.Format(time.TimeOnly), upto.Format(time.TimeOnly))
	var st []string
	for _, s := range []string{"succeeded", "skipped", "failed", "retrying", "running", "pending"} {
		if states[s] > 0 {
			st = append(st, fmt.Sprintf("%d %s", states[s], s))
		}
	}
	c.stat("schedule runs", "%d recorded (%s); %d skipped by overlap in the window; %d completed at attempt 2 or later; %d effects of superseded attempts (partial work)",
		len(d.runs), strings.Join(st, ", "), overlapSkips, retried, partial)
	c.stat("schedule start lag", "%s", startLag(d, p.schedules, from, upto, p.period))
	if err := c.schedEventStats(ctx); err != nil {
		return err
	}
	c.stat("schedule takeovers", "%d runs of SIGKILLed runners, next attempt started %s after the kill; %d runs of SIGSTOPped runners; %s",
		killed.Checked, latencies, stoppedN, pauseStat)
	return nil
}

// inFlight reports whether attempt a of k was running at t: started
// before, not yet superseded, and its run not completed by it before t.
func (d *schedData) inFlight(k runKey, a schedWrite, t time.Time) bool {
	if !a.at.Before(t) {
		return false
	}
	if n, ok := d.next(k, a.fence); ok && n.at.Before(t) {
		return false
	}
	if e, ok := d.effect(k, a.fence); ok && e.at.Before(t) {
		return false
	}
	r := d.runs[k]
	return !(r != nil && r.fence == a.fence && r.hasFinished && r.finished.Before(t))
}

// schedEventStats reports what the instances observed: runs taken over,
// instants missed, completions refused (EventLost), and the job's writes
// the fence refused, per instance.
func (c *checker) schedEventStats(ctx context.Context) error {
	rows, err := c.pool.Query(ctx, `SELECT kind, split_part(instance, '#', 1), count(*) FROM chaos_sched_events GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return err
	}
	per := map[string][]string{}
	total := map[string]int{}
	for rows.Next() {
		var kind, inst string
		var n int
		if err := rows.Scan(&kind, &inst, &n); err != nil {
			rows.Close()
			return err
		}
		per[kind] = append(per[kind], fmt.Sprintf("%s %d", inst, n))
		total[kind] += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	f := func(kind string) string {
		if total[kind] == 0 {
			return "0"
		}
		return fmt.Sprintf("%d (%s)", total[kind], strings.Join(per[kind], ", "))
	}
	c.stat("schedule events", "lost (ErrLost: completion refused or exclusivity lost) %s; writes refused by the fence %s; taken over %s; missed %s",
		f("lost"), f("refused"), f("taken over"), f("missed"))
	return nil
}

// startLag reports, per group, how long after its instant each instant of
// the window first started (its first attempt's first write, by the
// database's clock): p50, p99 and the largest, with the instant that had
// it. The catch-up window must stay well above the largest, or instants
// due during a fault are skipped as missed.
func startLag(d *schedData, schedules []string, from, upto time.Time, period time.Duration) string {
	lags := map[string][]time.Duration{}
	worst := map[string]runKey{}
	for _, name := range schedules {
		g := schedGroup(name)
		for t := from; !t.After(upto); t = t.Add(period) {
			k := runKey{name, t.UnixMicro()}
			as := d.attempts[k]
			if len(as) == 0 {
				continue
			}
			l := d.firstAt(k).Sub(t)
			if w, ok := worst[g]; !ok || l > d.firstAt(w).Sub(time.UnixMicro(w.instant)) {
				worst[g] = k
			}
			lags[g] = append(lags[g], l)
		}
	}
	var out []string
	for _, g := range slices.Sorted(maps.Keys(lags)) {
		ls := lags[g]
		slices.Sort(ls)
		q := func(f float64) time.Duration {
			return ls[min(len(ls)-1, int(f*float64(len(ls))))].Round(time.Millisecond)
		}
		out = append(out, fmt.Sprintf("%s p50 %v, p99 %v, max %v (%s)", g, q(0.5), q(0.99), ls[len(ls)-1].Round(time.Millisecond), fmtKey(worst[g])))
	}
	if len(out) == 0 {
		return "none started"
	}
	return strings.Join(out, "; ")
}

// firstAt is when the first attempt of k first wrote (zero: none did).
func (d *schedData) firstAt(k runKey) time.Time {
	var first time.Time
	for _, a := range d.attempts[k] {
		if first.IsZero() || a.at.Before(first) {
			first = a.at
		}
	}
	return first
}
