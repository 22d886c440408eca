package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	childproc "github.com/pgclaim/pgclaim/harness/child"
)

// The instances scenario: N instance processes (this executable re-run)
// against one server, each with its own pool, claiming rows of one table
// and firing the same gate.Once ticks, as N replicas of a service do.
const (
	envInstance = "PGCLAIM_BENCH_INSTANCE" // the instance's number
	envJob      = "PGCLAIM_BENCH_JOB"      // the gate job's name
	envLedger   = "PGCLAIM_BENCH_LEDGER"   // "1": gate.Config.LedgerOnly (behind PgBouncer)
	envSpread   = "PGCLAIM_BENCH_SPREAD"   // "1": claim.Config.Spread
	envHand     = "PGCLAIM_BENCH_HAND"     // "1": claim with hand-written SKIP LOCKED SQL, not pgclaim
)

const (
	// instancePoolConns is each instance's pool size.
	instancePoolConns = 2
	// instanceBatch is each instance's claim batch.
	instanceBatch = 100
	// instanceTick is how often every instance fires the shared gate job.
	instanceTick = 200 * time.Millisecond
)

// runInstances starts each count of instance processes in turn against one
// table of PAUSED rows and one gate job, and measures claim throughput,
// gate latency and the server connections they hold.
func runInstances(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, admin, done, err := e.scratch(ctx, 2)
	if err != nil {
		return err
	}
	defer done()
	if _, err := admin.Exec(ctx, pushDDL); err != nil {
		return err
	}
	r.setup("N instance processes (this executable re-run), each with its own pool of %d connections and one gate.Gate; they start together and run for %s", instancePoolConns, p.InstanceWindow)
	r.setup("each instance: one claim loop (ClaimBatch(%d), then FinishBatch and the effects in one transaction) on one table of %d PAUSED rows, and gate.Once on one shared job every %s (every instance fires every tick)", instanceBatch, p.InstanceRows, instanceTick)
	r.setup("each instance runs with GOMAXPROCS=%d, as a service in a container of that many CPUs (all of them share this machine's cores with the server)", p.InstanceProcs)
	r.setup("a tick that no instance ran must have been skipped loudly: claimed and recorded with its outcome (lost: the run's lock session was not confirmed in time, logged at error), or reported held (gate.HeldError, logged at warn) because the previous tick's run still held the job's lock")
	r.setup("Spread rows: the same, each instance's claimer with claim.Config.Spread (each batch starts at a random claimable row, sampled)")
	r.setup("server connections: the database's backends (pg_stat_activity), sampled every 100 ms, peak; each instance holds its pool's connections and one dedicated lock connection taken out of it (pool connections + 1)")

	tbl := Table{Title: "Instances: claim throughput and gate.Once against one server",
		Columns: []string{"instances", "rows/s", "claim p50", "gate.Once won p50", "skip p50", "ticks succeeded / due", "other outcomes (recorded)", "skipped held (loud)", "server connections (peak)", "per instance"}}
	type variant struct {
		n      int
		bnc    *bouncer.Bouncer // nil: straight to the server
		spread bool             // claim.Config.Spread
		hand   bool             // hand-written SKIP LOCKED SQL instead of pgclaim's claims
	}
	var vs []variant
	for _, spread := range []bool{false, true} {
		for _, n := range p.Instances {
			vs = append(vs, variant{n: n, spread: spread})
		}
	}
	// The floor straight to the server: what a service's own claim loop,
	// in key order, does at the same counts.
	for _, n := range p.Instances {
		vs = append(vs, variant{n: n, hand: true})
	}
	r.setup("hand-written SQL rows: the same instances, each claiming with the hand-written SKIP LOCKED loop of the baselines scenario (UPDATE … WHERE id IN (SELECT … ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING, one fenced finish + effects), prepared, straight to the server and behind PgBouncer: what a claim loop without pgclaim gets at these counts")
	if _, err := bouncer.Find(); err != nil {
		r.note("PgBouncer rows not run: %v", err)
	} else {
		b, err := bouncer.Start(ctx, db.Server.URL(), db.Name)
		if err != nil {
			return err
		}
		defer b.Stop()
		for _, spread := range []bool{false, true} {
			for _, n := range p.Instances {
				vs = append(vs, variant{n: n, bnc: b, spread: spread})
			}
		}
		for _, n := range p.Instances {
			vs = append(vs, variant{n: n, bnc: b, hand: true})
		}
		r.setup("behind PgBouncer (transaction pooling, default_pool_size 20): the same instances through one PgBouncer, their gates LedgerOnly (session advisory locks cannot live behind it)")
	}
	var dups, missing, unrun, errs int64
	for _, v := range vs {
		url, label := db.URL, strconv.Itoa(v.n)
		if v.bnc != nil {
			url, label = v.bnc.URL(db.Name, "bench-instance"), strconv.Itoa(v.n)+", PgBouncer"
		}
		if v.spread {
			label += ", Spread"
		}
		if v.hand {
			label += ", hand-written SQL"
		}
		n := v.n
		res, row, prof, counts, err := instancesRun(ctx, e, admin, url, p, n, label, v.bnc != nil, v.spread, v.hand)
		if err != nil {
			return fmt.Errorf("%s instances: %w", label, err)
		}
		if len(prof.Statements) > 0 {
			r.Profiles = append(r.Profiles, prof)
		}
		r.Results = append(r.Results, res)
		tbl.Rows = append(tbl.Rows, row)
		r.note("%s instances: %s", label, counts.active)
		dups += counts.dups
		missing += counts.lost
		unrun += counts.unrun
		errs += counts.errs
	}
	r.Tables = append(r.Tables, tbl)
	r.check("instances: rows with more than one effect", 0, dups)
	r.check("instances: rows done without an effect, or left PROCESSING", 0, missing)
	r.check("instances: ticks due in the window that no instance claimed, and none reported held", 0, unrun)
	r.check("instances: gate errors other than a skip", 0, errs)
	return nil
}

type instanceCounts struct {
	dups, lost, unrun, errs int64
	active                  string // the backends executing a statement, on average, by what they waited for
}

// describeActive says how many backends were executing a statement on
// average over samples, and what they were waiting for (CPU: running, or
// waiting for a core).
func describeActive(active map[string]int64, samples int64) string {
	if samples == 0 {
		return "not sampled"
	}
	var total int64
	kinds := make([]string, 0, len(active))
	for k, n := range active {
		total += n
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Compare(active[b], active[a]) })
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(active[k])/float64(samples)))
	}
	return fmt.Sprintf("%.1f backends executing on average (%s)", float64(total)/float64(samples), strings.Join(parts, ", "))
}

func instancesRun(ctx context.Context, e *env, admin *pgxpool.Pool, url string, p *params, n int, label string, ledger, spread, hand bool) (Result, []string, Profile, instanceCounts, error) {
	var counts instanceCounts
	if err := resetPush(ctx, admin, p.InstanceRows); err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	job := "bench-instances-" + strings.ReplaceAll(label, ", ", "-")
	type kid struct {
		proc  *childproc.Process
		lines chan string
		held  []int64 // ticks it skipped because another tick's run held the lock
	}
	kids := make([]*kid, 0, n)
	defer func() {
		for _, k := range kids {
			_ = k.proc.Kill()
			_ = k.proc.Stdin.Close()
			<-k.proc.Done()
		}
	}()
	end := e.prog.task("  instances: "+label, "started", int64(n), func() int64 { return int64(len(kids)) })
	for i := range n {
		k := &kid{lines: make(chan string, 64)}
		proc, err := childproc.Start(childproc.Config{
			Env: []string{envChild + "=instance", envURL + "=" + url, envInstance + "=" + strconv.Itoa(i), envJob + "=" + job,
				"GOMAXPROCS=" + strconv.Itoa(p.InstanceProcs), envLedger + "=" + boolEnv(ledger), envSpread + "=" + boolEnv(spread), envHand + "=" + boolEnv(hand)},
			Stdout:   func(line []byte) { k.lines <- string(line) },
			StderrTo: os.Stderr,
		})
		if err != nil {
			end()
			return Result{}, nil, Profile{}, counts, err
		}
		k.proc = proc
		kids = append(kids, k)
	}
	end()
	await := func(k *kid, kind string, timeout time.Duration) (string, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		exited := k.proc.Done()
		for {
			select {
			case l := <-k.lines:
				if strings.HasPrefix(l, kind) {
					return l, nil
				}
				if f := strings.Fields(l); len(f) == 2 && f[0] == "held" {
					if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
						k.held = append(k.held, ns)
					}
				}
				if strings.HasPrefix(l, "error") {
					return "", fmt.Errorf("instance %d: %s", k.proc.Pid(), l)
				}
			case <-exited:
				// Its output was all read before Done closed: take what
				// is still queued first.
				if len(k.lines) > 0 {
					exited = nil
					continue
				}
				return "", fmt.Errorf("instance %d exited before %q", k.proc.Pid(), kind)
			case <-t.C:
				return "", fmt.Errorf("instance %d: no %q within %s", k.proc.Pid(), kind, timeout)
			}
		}
	}
	for _, k := range kids {
		if _, err := await(k, "ready", 60*time.Second); err != nil {
			return Result{}, nil, Profile{}, counts, err
		}
	}
	var dbName string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&dbName); err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	ph := e.begin(ctx, dbName)
	start := time.Now().Add(200 * time.Millisecond)
	until := start.Add(p.InstanceWindow)
	for _, k := range kids {
		if _, err := fmt.Fprintf(k.proc.Stdin, "go %d\n", until.UnixNano()); err != nil {
			return Result{}, nil, Profile{}, counts, err
		}
	}
	// Sample the database's backends while the instances run.
	var peak atomic.Int64
	active := map[string]int64{} // active backends by wait event type, summed over samples
	var samples int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			var c int64
			var kinds []string
			var ns []int64
			err := admin.QueryRow(sampleCtx, `SELECT count(*),
       coalesce(array_agg(w) FILTER (WHERE w IS NOT NULL), '{}'), coalesce(array_agg(n) FILTER (WHERE w IS NOT NULL), '{}')
FROM (SELECT pid, NULL::text AS w, NULL::bigint AS n FROM pg_stat_activity WHERE datname = $1
      UNION ALL
      SELECT NULL, coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) FROM pg_stat_activity
      WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid() GROUP BY 2) x
WHERE pid IS NOT NULL OR w IS NOT NULL`, dbName).Scan(&c, &kinds, &ns)
			if err == nil {
				c -= int64(len(kinds))
				if c > peak.Load() {
					peak.Store(c)
				}
				samples++
				for i, k := range kinds {
					active[k] += ns[i]
				}
			}
			select {
			case <-sampleCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var reps []instanceReport
	var firstErr string
	for _, k := range kids {
		l, err := await(k, "done", p.InstanceWindow+60*time.Second)
		if err != nil {
			stopSampling()
			<-sampled
			return Result{}, nil, Profile{}, counts, err
		}
		rep, err := parseInstanceDone(l)
		if err != nil {
			stopSampling()
			<-sampled
			return Result{}, nil, Profile{}, counts, err
		}
		if rep.firstError != "" && firstErr == "" {
			firstErr = rep.firstError
		}
		reps = append(reps, rep)
	}
	stopSampling()
	<-sampled
	prof := ph.end(ctx, label+" instances", 6)

	var rows, won, tried, errsN int64
	var claimP50, onceP50, skipP50 []time.Duration
	var elapsed time.Duration // the longest claim loop: the table may run out first
	for _, rep := range reps {
		rows += rep.rows
		elapsed = max(elapsed, rep.claimFor)
		won += rep.onceWon
		tried += rep.onceTried
		errsN += rep.onceErrors
		claimP50 = append(claimP50, rep.claimP50)
		if rep.onceP50 > 0 {
			onceP50 = append(onceP50, rep.onceP50)
		}
		if rep.onceSkipP50 > 0 {
			skipP50 = append(skipP50, rep.onceSkipP50)
		}
	}
	if firstErr != "" {
		e.prog.logf("instances: %s: first gate error: %s", label, firstErr)
	}
	c, err := countEffects(ctx, admin)
	if err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	counts.dups = c.duplicates()
	counts.lost = abs64(c.Done-c.Distinct) + c.Processing
	counts.errs = errsN
	// Every tick strictly inside the window was fired by every instance:
	// exactly one ledger row each, succeeded.
	var due, ran int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM generate_series($1::timestamptz, $2::timestamptz, $3::interval) AS t`,
		start.Truncate(instanceTick).Add(2*instanceTick), until.Truncate(instanceTick).Add(-instanceTick), instanceTick.String()).Scan(&due); err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	from, to := start.Truncate(instanceTick).Add(2*instanceTick), until.Truncate(instanceTick).Add(-instanceTick)
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pgclaim_ticks WHERE job = $1 AND outcome = 'succeeded' AND fire_at BETWEEN $2 AND $3`,
		job, from, to).Scan(&ran); err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	// A tick no instance ran must have been reported held by one: skipped
	// loudly because the previous tick's run still held the job's lock.
	held := map[int64]bool{}
	for _, k := range kids {
		for _, ns := range k.held {
			if at := time.Unix(0, ns); !at.Before(from) && !at.After(to) {
				held[ns] = true
			}
		}
	}
	rows1, err := admin.Query(ctx, `SELECT t FROM generate_series($1::timestamptz, $2::timestamptz, $3::interval) AS t
WHERE NOT EXISTS (SELECT 1 FROM pgclaim_ticks k WHERE k.job = $4 AND k.fire_at = t)
  AND NOT (t = ANY($5::timestamptz[]))`, from, to, instanceTick.String(), job, heldTimes(held))
	if err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	unrun, err := pgx.CollectRows(rows1, pgx.RowTo[time.Time])
	if err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	counts.unrun = int64(len(unrun))
	counts.active = describeActive(active, samples)
	describeUnrun(e, label, from, unrun, reps)
	// A claimed tick whose run did not succeed is recorded with its
	// outcome (lost: the lock's session was not confirmed in time).
	var others []string
	rows2, err := admin.Query(ctx, `SELECT outcome, count(*) FROM pgclaim_ticks WHERE job = $1 AND fire_at BETWEEN $2 AND $3 AND outcome <> 'succeeded' GROUP BY outcome ORDER BY outcome`, job, from, to)
	if err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	for rows2.Next() {
		var o string
		var c int64
		if err := rows2.Scan(&o, &c); err != nil {
			rows2.Close()
			return Result{}, nil, Profile{}, counts, err
		}
		others = append(others, fmt.Sprintf("%d %s", c, o))
	}
	rows2.Close()
	if err := rows2.Err(); err != nil {
		return Result{}, nil, Profile{}, counts, err
	}
	recorded := "-"
	if len(others) > 0 {
		recorded = strings.Join(others, ", ")
	}

	if elapsed < p.InstanceWindow*9/10 {
		e.prog.logf("instances: %s: the table ran out of rows after %s of %s", label, elapsed.Round(time.Millisecond), p.InstanceWindow)
	}
	perSec := float64(rows) / elapsed.Seconds()
	group := "pgclaim"
	if hand {
		group = "baseline"
	}
	res := Result{Group: group, Name: label + " instances", Workers: n, Batch: instanceBatch,
		Ops: rows, Unit: "rows", Seconds: elapsed.Seconds(), PerSecond: perSec,
		P50us: us(median(claimP50)),
		Extra: map[string]float64{
			"instances": float64(n), "once_won_p50_us": us(median(onceP50)), "once_skip_p50_us": us(median(skipP50)),
			"ticks_due": float64(due), "ticks_run": float64(ran), "once_won": float64(won), "once_tried": float64(tried),
			"server_connections_peak": float64(peak.Load()), "ticks_held": float64(len(held)),
		}}
	per := "-"
	if n > 0 {
		per = fmt.Sprintf("%.1f", float64(peak.Load())/float64(n))
	}
	row := []string{label, fmt.Sprintf("%.0f", perSec), fmtUs(res.P50us), fmtUs(res.Extra["once_won_p50_us"]),
		fmtUs(res.Extra["once_skip_p50_us"]), fmt.Sprintf("%d / %d", ran, due), recorded, strconv.Itoa(len(held)), strconv.FormatInt(peak.Load(), 10), per}
	return res, row, prof, counts, nil
}

// heldTimes returns the ticks of held as times, for a query.
func heldTimes(held map[int64]bool) []time.Time {
	out := make([]time.Time, 0, len(held))
	for ns := range held {
		out = append(out, time.Unix(0, ns))
	}
	return out
}

// describeUnrun logs each tick of unrun (ticks that no instance claimed
// and none reported held) with what each instance's Once returned for it.
func describeUnrun(e *env, label string, from time.Time, ticks []time.Time, reps []instanceReport) {
	for _, at := range ticks {
		seen := map[byte]int{}
		for _, rep := range reps {
			o := byte('-')
			if !rep.firstTick.IsZero() && !at.Before(rep.firstTick) {
				if i := int(at.Sub(rep.firstTick) / instanceTick); i < len(rep.outcomes) {
					o = rep.outcomes[i]
				}
			}
			seen[o]++
		}
		e.prog.logf("instances: %s: tick %s (%s into the window) unclaimed; instances' Once: %d won, %d taken, %d held, %d skewed, %d error, %d not fired",
			label, at.UTC().Format("15:04:05.000"), at.Sub(from).Round(time.Millisecond), seen['w'], seen['t'], seen['h'], seen['k'], seen['e'], seen['-'])
	}
}
