package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Check is one invariant, with how many items were checked and how many
// broke it.
type Check struct {
	Name       string   // what is checked
	Checked    int      // how many items (rows, instants, terms, ...) were checked
	Violations int      // how many broke the invariant
	Examples   []string // up to maxExamples violations, described
}

const maxExamples = 5

func (c *Check) fail(format string, args ...any) {
	c.Violations++
	if len(c.Examples) < maxExamples {
		c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
	}
}

// Stat is one figure of the workload, for the report.
type Stat struct {
	Name  string // what is counted
	Value string // the figures
}

// Names of the checks.
const (
	checkRowsOnce       = "rows: every DONE row took effect exactly once"
	checkRowsFailed     = "rows: every FAILED row has a reason and no effect"
	checkRowsLost       = "rows: none lost (left PAUSED)"
	checkRowsStuck      = "rows: none stuck PROCESSING"
	checkFence          = "fencing: no write with a superseded token took effect"
	checkSchedWindow    = "schedules: every due instant in the window ended succeeded"
	checkSchedEffects   = "schedules: every succeeded instant has exactly one effect, with the succeeded fence"
	checkSchedExclusive = "schedules: no two attempts of one instant ran at once"
	checkSchedZombies   = "schedules: zombie completions refused (the succeeded attempt is the newest)"
	checkSchedKilled    = "schedules: a SIGKILLed runner's instant completed by a later attempt within the bound"
	checkSchedStopped   = "schedules: a runner SIGSTOPped past its lease wrote nothing after it expired, nor completed a run taken over"
	checkSchedPaused    = "schedules: nothing recorded or started while paused; paused instants run at resume"
	checkTicksOnce      = "ticks: no gate.Once tick took effect twice"
	checkTicksFence     = "ticks: every tick's effect carries the fence its ledger row was claimed with"
	checkTerms          = "leaders: terms never overlap (database time)"
	checkLeaderLog      = "leaders: writes only inside the writer's own term"
	checkPooler         = "pooler: advisory variants refuse behind PgBouncer, lease variants work"
	checkInstances      = "instances: no unexpected exit"
)

// checkParams is what the checker needs to know about the run.
type checkParams struct {
	period                time.Duration
	tStart, tStop         time.Time // the window of instants that must have run
	maxAttempts           int
	schedules             []string
	schedLease, schedPoll time.Duration
	faulted               bool // some fault (other than the bouncer topology) was injected
	kills                 []hit
	stops                 []stop
	restarts              []time.Time
	stalls                []span              // the database not answering the harness's probe (stall.go)
	groupInstances        map[string][]string // schedule group → the instances running it
	elections             []string
	unexpected            []string
	processes             int // instance processes started
}

type checker struct {
	pool   *pgxpool.Pool
	p      checkParams
	checks []Check
	stats  []Stat
}

// check runs every invariant check on the final state of the database.
func check(ctx context.Context, pool *pgxpool.Pool, p checkParams) ([]Check, []Stat, error) {
	c := &checker{pool: pool, p: p}
	for _, f := range []func(context.Context) error{c.rows, c.fencing, c.ticks, c.schedules, c.leaders} {
		if err := f(ctx); err != nil {
			return nil, nil, err
		}
	}
	inst := Check{Name: checkInstances, Checked: p.processes}
	for _, u := range p.unexpected {
		inst.fail("%s", u)
	}
	c.checks = append(c.checks, inst)
	return c.checks, c.stats, nil
}

func (c *checker) stat(name, format string, args ...any) {
	c.stats = append(c.stats, Stat{Name: name, Value: fmt.Sprintf(format, args...)})
}

// rows: every row is DONE with exactly one effect carrying its final token,
// or FAILED with a reason and no effect; nothing PAUSED or PROCESSING.
func (c *checker) rows(ctx context.Context) error {
	var total, done, failed, effects, swept, sweptFailed int
	err := c.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM chaos_rows),
		(SELECT count(*) FROM chaos_rows WHERE state = 'DONE'),
		(SELECT count(*) FROM chaos_rows WHERE state = 'FAILED'),
		(SELECT count(*) FROM chaos_effects),
		(SELECT count(*) FROM chaos_sweeps),
		(SELECT count(*) FROM chaos_sweeps WHERE state = 'FAILED')`).Scan(&total, &done, &failed, &effects, &swept, &sweptFailed)
	if err != nil {
		return fmt.Errorf("chaos: check rows: %w", err)
	}
	once := Check{Name: checkRowsOnce, Checked: done}
	fail := Check{Name: checkRowsFailed, Checked: failed}
	lost := Check{Name: checkRowsLost, Checked: total}
	stuck := Check{Name: checkRowsStuck, Checked: total}
	// Only rows that are not plainly right come back.
	rows, err := c.pool.Query(ctx, `SELECT r.id, r.state, coalesce(r.fence, 0), r.reason, r.attempts,
			coalesce(e.n, 0), coalesce(e.fences, '{}')
		FROM chaos_rows r
		LEFT JOIN (SELECT row_id, count(*) AS n, array_agg(fence ORDER BY at) AS fences
		           FROM chaos_effects GROUP BY row_id) e ON e.row_id = r.id
		WHERE NOT (r.state = 'DONE' AND e.n = 1 AND e.fences[1] = r.fence)
		  AND NOT (r.state = 'FAILED' AND r.reason IS NOT NULL AND e.n IS NULL)
		ORDER BY r.id`)
	if err != nil {
		return fmt.Errorf("chaos: check rows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, fence    int64
			state        string
			reason       *string
			attempts, n  int
			effectFences []int64
		)
		if err := rows.Scan(&id, &state, &fence, &reason, &attempts, &n, &effectFences); err != nil {
			return err
		}
		switch state {
		case "DONE":
			once.fail("row %d: DONE with fence %d, %d effects with fences %v", id, fence, n, effectFences)
		case "FAILED":
			fail.fail("row %d: FAILED (reason %v) with %d effects %v", id, deref(reason), n, effectFences)
		case "PAUSED":
			lost.fail("row %d: still PAUSED after %d attempts (%d effects)", id, attempts, n)
		case "PROCESSING":
			stuck.fail("row %d: still PROCESSING with fence %d (%d effects)", id, fence, n)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var orphans int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM chaos_effects e
		WHERE NOT EXISTS (SELECT 1 FROM chaos_rows r WHERE r.id = e.row_id)`).Scan(&orphans); err != nil {
		return err
	}
	if orphans > 0 {
		once.Violations += orphans
		once.Examples = append(once.Examples, fmt.Sprintf("%d effects for rows that do not exist", orphans))
	}
	var failedWork int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM chaos_rows WHERE state = 'FAILED' AND reason LIKE 'work failed%'`).Scan(&failedWork); err != nil {
		return err
	}
	c.checks = append(c.checks, once, fail, lost, stuck)
	c.stat("rows", "%d: %d DONE, %d FAILED (%d by the work, %d swept after %d attempts)",
		total, done, failed, failedWork, failed-failedWork, c.p.maxAttempts)
	c.stat("effects", "%d", effects)
	c.stat("sweeps", "%d rows moved by sweepers (%d to FAILED)", swept, sweptFailed)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", *s)
}

// fencing: no effect carries a token other than its row's final one, no
// finish reported success with a superseded token, and no finish the fence
// refused left an effect.
func (c *checker) fencing(ctx context.Context) error {
	ck := Check{Name: checkFence}
	var effects, auditN, refused int
	if err := c.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM chaos_effects), (SELECT count(*) FROM chaos_audit),
		(SELECT count(*) FROM chaos_audit WHERE result = 'lost')`).Scan(&effects, &auditN, &refused); err != nil {
		return fmt.Errorf("chaos: check fencing: %w", err)
	}
	ck.Checked = effects + auditN
	queries := []struct {
		what, sql string
	}{
		{"effect with a superseded token", `SELECT e.row_id, e.fence, coalesce(r.fence, 0), e.instance
			FROM chaos_effects e JOIN chaos_rows r ON r.id = e.row_id
			WHERE e.fence IS DISTINCT FROM r.fence ORDER BY e.row_id`},
		{"finish reported done with a superseded token", `SELECT a.row_id, a.fence, coalesce(r.fence, 0), a.instance
			FROM chaos_audit a JOIN chaos_rows r ON r.id = a.row_id
			WHERE a.result = 'done' AND a.fence IS DISTINCT FROM r.fence ORDER BY a.row_id`},
		{"finish refused by the fence yet its effect exists", `SELECT a.row_id, a.fence, coalesce(r.fence, 0), a.instance
			FROM chaos_audit a JOIN chaos_rows r ON r.id = a.row_id
			WHERE a.result = 'lost' AND EXISTS (
				SELECT 1 FROM chaos_effects e WHERE e.row_id = a.row_id AND e.fence = a.fence)
			ORDER BY a.row_id`},
	}
	for _, q := range queries {
		rows, err := c.pool.Query(ctx, q.sql)
		if err != nil {
			return fmt.Errorf("chaos: check fencing: %w", err)
		}
		for rows.Next() {
			var id, fence, final int64
			var inst string
			if err := rows.Scan(&id, &fence, &final, &inst); err != nil {
				rows.Close()
				return err
			}
			ck.fail("row %d: %s: fence %d by %s, row's fence %d", id, q.what, fence, inst, final)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	c.checks = append(c.checks, ck)
	var doneN, retryN, failedN, errN int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE result = 'done'), count(*) FILTER (WHERE result = 'retry'),
		count(*) FILTER (WHERE result = 'failed'), count(*) FILTER (WHERE result = 'error') FROM chaos_audit`).Scan(&doneN, &retryN, &failedN, &errN); err != nil {
		return err
	}
	c.stat("finishes attempted", "%d: %d done, %d retry, %d failed, %d refused by the fence (zombie or swept claims), %d not committed (error)",
		auditN, doneN, retryN, failedN, refused, errN)
	return nil
}

// ticks: the shared gate.Once job took effect at most once per fire time,
// and each effect belongs to the run that claimed its tick in the ledger.
// A tick whose holder died may have no effect (Once does not run a tick
// again), and one skipped because the job's lock was held is reported by
// the gate, not run.
func (c *checker) ticks(ctx context.Context) error {
	once := Check{Name: checkTicksOnce}
	fence := Check{Name: checkTicksFence}
	rows, err := c.pool.Query(ctx, `SELECT e.fire_at, count(*), array_agg(e.instance ORDER BY e.at),
			count(*) FILTER (WHERE t.fence IS DISTINCT FROM e.fence), min(t.fence)
		FROM chaos_tick_effects e
		LEFT JOIN pgclaim_ticks t ON t.job = $1 AND t.fire_at = e.fire_at
		GROUP BY e.fire_at ORDER BY e.fire_at`, tickJob)
	if err != nil {
		return fmt.Errorf("chaos: check ticks: %w", err)
	}
	for rows.Next() {
		var at time.Time
		var n, wrong int
		var instances []string
		var ledgerFence *int64
		if err := rows.Scan(&at, &n, &instances, &wrong, &ledgerFence); err != nil {
			rows.Close()
			return err
		}
		once.Checked++
		fence.Checked += n
		if n > 1 {
			once.fail("tick %s took effect %d times (instances %v)", at.Format(time.RFC3339Nano), n, instances)
		}
		for range wrong {
			if ledgerFence == nil {
				fence.fail("tick %s has an effect and no ledger row", at.Format(time.RFC3339Nano))
			} else {
				fence.fail("tick %s has an effect whose fence is not the ledger's %d", at.Format(time.RFC3339Nano), *ledgerFence)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var outcomes string
	if err := c.pool.QueryRow(ctx, `SELECT coalesce(string_agg(outcome || ' ' || n, ', ' ORDER BY outcome), 'none')
		FROM (SELECT outcome::text, count(*) AS n FROM pgclaim_ticks WHERE job = $1 GROUP BY outcome) o`, tickJob).Scan(&outcomes); err != nil {
		return fmt.Errorf("chaos: count ticks: %w", err)
	}
	c.stat("ticks", "%d fire times took effect (%s, one-second ticks of each instance's clock); ledger: %s", once.Checked, tickJob, outcomes)
	c.checks = append(c.checks, once, fence)
	return nil
}

// leaders: per election, every term ends before the next begins (database
// time), at most one is open; every leader write carries an existing term
// of its writer and lies inside it.
func (c *checker) leaders(ctx context.Context) error {
	terms := Check{Name: checkTerms}
	rows, err := c.pool.Query(ctx, `SELECT election, term, holder, started_at, ended_at, coalesce(end_reason, '')
		FROM pgclaim_terms WHERE election = ANY($1) ORDER BY election, started_at, term`, c.p.elections)
	if err != nil {
		return fmt.Errorf("chaos: check terms: %w", err)
	}
	type term struct {
		election, holder, reason string
		term                     int64
		start                    time.Time
		end                      *time.Time
	}
	var all []term
	for rows.Next() {
		var t term
		if err := rows.Scan(&t.election, &t.term, &t.holder, &t.start, &t.end, &t.reason); err != nil {
			rows.Close()
			return err
		}
		all = append(all, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	perElection := map[string]int{}
	reasons := map[string]int{}
	terms.Checked = len(all)
	for i, t := range all {
		perElection[t.election]++
		if t.reason == "" {
			reasons["open"]++
		} else {
			reasons[t.reason]++
		}
		if i == 0 || all[i-1].election != t.election {
			continue
		}
		prev := all[i-1]
		switch {
		case prev.end == nil:
			terms.fail("%s: term %d (%s) still open when term %d (%s) began at %s",
				t.election, prev.term, prev.holder, t.term, t.holder, t.start.Format(time.RFC3339Nano))
		case prev.end.After(t.start):
			terms.fail("%s: term %d (%s) ended at %s, after term %d (%s) began at %s",
				t.election, prev.term, prev.holder, prev.end.Format(time.RFC3339Nano), t.term, t.holder, t.start.Format(time.RFC3339Nano))
		}
	}

	logs := Check{Name: checkLeaderLog}
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM chaos_leader_log`).Scan(&logs.Checked); err != nil {
		return err
	}
	// A write is fenced by its term in the same statement (the term row
	// is locked FOR SHARE): it can follow the term's recorded end only by
	// the time a statement takes; a second is far beyond that.
	lrows, err := c.pool.Query(ctx, `SELECT l.election, l.term, l.instance, l.at, t.holder, t.started_at, t.ended_at
		FROM chaos_leader_log l
		LEFT JOIN pgclaim_terms t ON t.election = l.election AND t.term = l.term
		WHERE t.term IS NULL OR t.holder <> l.instance OR l.at < t.started_at
		   OR l.at > coalesce(t.ended_at, 'infinity') + interval '1 second'
		ORDER BY l.at`)
	if err != nil {
		return err
	}
	for lrows.Next() {
		var election, inst string
		var holder *string
		var tm int64
		var at time.Time
		var start, end *time.Time
		if err := lrows.Scan(&election, &tm, &inst, &at, &holder, &start, &end); err != nil {
			lrows.Close()
			return err
		}
		logs.fail("%s: write by %s for term %d at %s; term holder %v, %v to %v",
			election, inst, tm, at.Format(time.RFC3339Nano), derefStr(holder), fmtTime(start), fmtTime(end))
	}
	lrows.Close()
	if err := lrows.Err(); err != nil {
		return err
	}
	c.checks = append(c.checks, terms, logs)
	s := ""
	for _, e := range c.p.elections {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", e, perElection[e])
	}
	c.stat("leader terms", "%s (ended: %d resigned, %d lost, %d expired, %d superseded, %d open)", s,
		reasons["resigned"], reasons["lost"], reasons["expired"], reasons["superseded"], reasons["open"])
	c.stat("leader writes", "%d fenced heartbeats", logs.Checked)
	return nil
}

func derefStr(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "open"
	}
	return t.Format(time.RFC3339Nano)
}
