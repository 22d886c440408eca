package chaos

// The Patroni mode's checks and figures after the faults stop.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// check returns the Patroni mode's checks and figures: the configuration,
// the sampler's rounds, every fault's promotion and rejoin, the timings
// after each promotion, and the acknowledged commits the database no
// longer has (a violation in synchronous mode, a figure otherwise).
func (p *patroniRun) check(ctx context.Context, pool *pgxpool.Pool) ([]Check, []Stat, error) {
	p.sampling.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	checks := []Check{p.conf, p.dual, p.rejoin}
	var stats []Stat
	stat := func(name, format string, args ...any) {
		stats = append(stats, Stat{Name: name, Value: fmt.Sprintf(format, args...)})
	}

	// Faults and timeline.
	n := map[Fault]int{}
	for _, e := range p.events {
		n[e.kind]++
	}
	tl := int64(0)
	if prim := p.c.primary(); prim != nil {
		tl, _ = p.c.timeline(ctx, prim)
	}
	mode := "asynchronous"
	if p.sync {
		mode = "synchronous_mode on"
	}
	stat("patroni", "2 nodes (%s): %d switchovers (%d refused), %d failovers (SIGKILL), %d silent hosts, %d failovers after a stalled WAL sender (%d restarted in place); timeline %d to %d",
		mode, n[FaultSwitchover], p.refused[FaultSwitchover], n[FaultFailover], n[FaultSilent], n[FaultLag], p.refused[FaultLag], p.tlStart, tl)

	// Timings.
	var parts []string
	for _, k := range PatroniFaults {
		var ds []time.Duration
		for _, e := range p.events {
			if e.kind == k && !e.promoted.IsZero() {
				ds = append(ds, e.promoted.Sub(e.at))
			}
		}
		if len(ds) > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", k, pct(ds)))
		}
	}
	if len(parts) > 0 {
		stat("fault to promotion", "%s", strings.Join(parts, "; "))
	}
	after := func(what string, field func(*promotion) time.Time) string {
		var ds []time.Duration
		missing := 0
		for _, e := range p.events {
			if e.promoted.IsZero() {
				continue
			}
			if t := field(e); t.IsZero() {
				missing++
			} else {
				ds = append(ds, t.Sub(e.promoted))
			}
		}
		s := what + " " + pct(ds)
		if missing > 0 {
			s += fmt.Sprintf(" (%d promotions without one before the next fault)", missing)
		}
		return s
	}
	stat("promotion to the first", "%s; %s; %s",
		after("insert (harness)", func(e *promotion) time.Time { return e.firstWrite }),
		after("claim", func(e *promotion) time.Time { return e.firstClaim }),
		after("schedule run succeeded", func(e *promotion) time.Time { return e.firstRun }))

	// Acknowledged, then lost: the finish's effect row (written in the
	// acknowledged transaction) is gone; the run's success is not the
	// acknowledged holder's and fence.
	ids, fences, holders := make([]int64, 0, len(p.rows)), make([]int64, 0, len(p.rows)), make([]string, 0, len(p.rows))
	for id, a := range p.rows {
		ids, fences, holders = append(ids, id), append(fences, a.fence), append(holders, a.holder)
	}
	var rowsLost, rowsRerun int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE EXISTS (
			SELECT 1 FROM chaos_rows r WHERE r.id = a.id AND r.state = 'DONE'))
		FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS a(id, fence, holder)
		WHERE NOT EXISTS (SELECT 1 FROM chaos_effects e WHERE e.row_id = a.id AND e.fence = a.fence AND e.instance = a.holder)`,
		ids, fences, holders).Scan(&rowsLost, &rowsRerun); err != nil {
		return nil, nil, fmt.Errorf("chaos: check acknowledged rows: %w", err)
	}
	names, instants, rfences, rholders := []string{}, []time.Time{}, []int64{}, []string{}
	for k, a := range p.runs {
		names, instants = append(names, k.schedule), append(instants, time.UnixMicro(k.instant))
		rfences, rholders = append(rfences, a.fence), append(rholders, a.holder)
	}
	var runsLost, runsRerun int
	var lostEx []string
	rows, err := pool.Query(ctx, `SELECT a.schedule, a.instant, a.fence, a.holder, coalesce(r.state, 'no row'), coalesce(r.fence, 0), coalesce(r.holder, '')
		FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::text[]) AS a(schedule, instant, fence, holder)
		LEFT JOIN pgclaim_schedule_runs r ON r.schedule = a.schedule AND r.instant = a.instant
		WHERE NOT (r.state IS NOT DISTINCT FROM 'succeeded' AND r.fence IS NOT DISTINCT FROM a.fence AND r.holder IS NOT DISTINCT FROM a.holder)`,
		names, instants, rfences, rholders)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: check acknowledged runs: %w", err)
	}
	for rows.Next() {
		var s, state, holder, rholder string
		var at time.Time
		var fence, rfence int64
		if err := rows.Scan(&s, &at, &fence, &holder, &state, &rfence, &rholder); err != nil {
			rows.Close()
			return nil, nil, err
		}
		runsLost++
		if state == "succeeded" {
			runsRerun++
		}
		if len(lostEx) < maxExamples {
			lostEx = append(lostEx, fmt.Sprintf("%s: success by %s (fence %d) acknowledged; now %s, fence %d by %s",
				fmtKey(runKey{s, at.UnixMicro()}), holder, fence, state, rfence, rholder))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	stat("acknowledged, then lost", "%d of %d DONE finishes (%d rows done again since); %d of %d schedule runs' successes (%d run again since)",
		rowsLost, len(p.rows), rowsRerun, runsLost, len(p.runs), runsRerun)
	if p.sync {
		lost := Check{Name: checkPatroniLost, Checked: len(p.rows) + len(p.runs), Violations: rowsLost + runsLost}
		if rowsLost > 0 {
			lost.Examples = append(lost.Examples, fmt.Sprintf("%d acknowledged DONE finishes have no effect row any more", rowsLost))
		}
		lost.Examples = append(lost.Examples, lostEx...)
		checks = append(checks, lost)
	}
	return checks, stats, nil
}

// pct formats p50 and p99 (and how many) of ds.
func pct(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return fmt.Sprintf("p50 %s, p99 %s (n=%d)", at(0.5).Round(time.Millisecond), at(0.99).Round(time.Millisecond), len(s))
}
