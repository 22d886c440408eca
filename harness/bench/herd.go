package bench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// The herd scenario: N instances, each its own pool of herdPoolConns, all
// running the same M jobs due at the same instants, on a server with a
// stock connection limit; side by side with River's periodic jobs (a child
// process: harness/bench/herdriver, a module of its own) and with gate +
// the robfig adapter.

const (
	herdPoolConns = 4
	herdJobSleep  = 200 * time.Millisecond
	// herdRiverWorkers is MaxWorkers of each River client's queue.
	herdRiverWorkers = 20
	// envHerdRiver names a built herdriver binary, instead of building it
	// from harness/bench/herdriver.
	envHerdRiver = "PGCLAIM_BENCH_HERDRIVER"
	// herdCounter is the application_name of the scenario's own connection
	// on a side's database, left out of the backends counted.
	herdCounter = "pgclaim-bench-herd"
)

// herdShape is one shape of the herd: Instances × Schedules due every
// Period, measured over Instants instants.
type herdShape struct {
	Instances, Schedules int
	Period               time.Duration
	Instants             int
	// MaxConnections of the server (0: 100, the stock limit).
	MaxConnections int
	// Processes runs the pgclaim side's instances each in a process of
	// its own (herdproc.go), not as goroutines of this one.
	Processes bool
	// HolderFrom is the number of the first instance (its holder is
	// "herd-<n>").
	HolderFrom int
	// Bouncer puts PgBouncer in transaction mode (harness/bouncer, its
	// server pool 20 connections) between the pgclaim side's instances and
	// the server; the schedulers then hold lease rows (LeaseLocks).
	Bouncer bool
	// MaxConcurrent is the pgclaim side's schedule.Config.MaxConcurrent
	// (0: the default).
	MaxConcurrent int
	// RiverWorkers is MaxWorkers of each River client's queue (0:
	// herdRiverWorkers).
	RiverWorkers int
	// Sides run, in order: "pgclaim" (schedule.Scheduler), "river"
	// (River's periodic jobs), "robfig" (gate + cronx/robfig).
	Sides []string
}

func (s herdShape) label() string {
	l := fmt.Sprintf("%d × %d every %s", s.Instances, s.Schedules, s.Period)
	if s.Processes {
		l = fmt.Sprintf("%d processes × %d every %s", s.Instances, s.Schedules, s.Period)
	}
	if s.Bouncer {
		l += " behind PgBouncer"
	}
	if s.MaxConcurrent > 0 {
		l += fmt.Sprintf(", MaxConcurrent %d", s.MaxConcurrent)
	}
	if s.RiverWorkers > 0 {
		l += fmt.Sprintf(", River's MaxWorkers %d", s.RiverWorkers)
	}
	return l
}

// statsSettle is how long after a side has started the transaction count
// may begin: PostgreSQL reports an idle backend's statistics within 10 s.
const statsSettle = 11 * time.Second

// herdRoomShapes are the herd's shapes at equal room: pgclaim's
// MaxConcurrent and River's MaxWorkers both room, 8 × 500 on a stock
// server and 64 × 100 on one sized to pgclaim's budget.
func herdRoomShapes(room int) []herdShape {
	both := []string{"pgclaim", "river"}
	return []herdShape{
		{Instances: 8, Schedules: 500, Period: 10 * time.Second, Instants: 3, MaxConcurrent: room, RiverWorkers: room, Sides: both},
		{Instances: 64, Schedules: 100, Period: 10 * time.Second, Instants: 3, MaxConnections: 64*(herdPoolConns+schedDedicated) + 10,
			MaxConcurrent: room, RiverWorkers: room, Sides: both},
	}
}

// riverWorkers is MaxWorkers of the shape's River clients.
func (s herdShape) riverWorkers() int {
	if s.RiverWorkers > 0 {
		return s.RiverWorkers
	}
	return herdRiverWorkers
}

func (s herdShape) spec() string {
	if s.Period == time.Second {
		return "* * * * * *"
	}
	return fmt.Sprintf("*/%d * * * * *", int(s.Period/time.Second))
}

// herdSide is what one side of a shape measured.
type herdSide struct {
	due, ran, dups   int64
	lag              summary
	peakBackends     int64
	xactsPerInstant  float64
	stmtsPerInstant  float64 // client-side count (pgclaim sides); 0: not counted
	errors           int64   // job errors (inserts refused, …)
	startErrors      int64   // Register / NewJob calls that failed
	firstError       string
	warnings         *logCount
	riverVersion     string
	measuredInstants int
	dupDetail        []string // how the first duplicates came about
	events           *schedEvents
}

// herdServers starts (and reuses) one throwaway server per connection
// limit; on a server named by URL every shape runs on it as it is.
type herdServers struct {
	e       *env
	byLimit map[int]*pgtest.Server
	owned   []*pgtest.Server
}

func (h *herdServers) get(ctx context.Context, limit int) (*pgtest.Server, bool, error) {
	if h.e.cfg.DatabaseURL != "" || os.Getenv(pgtest.EnvURL) != "" {
		return h.e.srv, false, nil
	}
	if s, ok := h.byLimit[limit]; ok {
		return s, true, nil
	}
	h.e.prog.logf("  herd: starting a server with max_connections = %d...", limit)
	s, err := pgtest.Start(ctx, pgtest.Config{NoContainer: true, Settings: []string{fmt.Sprintf("max_connections=%d", limit)},
		Logf: func(f string, a ...any) { h.e.prog.logf("postgres: "+f, a...) }})
	if err != nil {
		return nil, false, err
	}
	h.byLimit[limit] = s
	h.owned = append(h.owned, s)
	return s, true, nil
}

func (h *herdServers) close() {
	for _, s := range h.owned {
		_ = s.Close()
	}
}

func runHerd(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	servers := &herdServers{e: e, byLimit: map[int]*pgtest.Server{}}
	defer servers.close()
	r.setup("N instances, each a goroutine with its own pgxpool (MaxConns %d) (or, in the shapes marked processes, each a process of its own: this executable re-run), all running the same M jobs due at the same instants; each job inserts one row through its pool (started = clock_timestamp()) and sleeps %s", herdPoolConns, herdJobSleep)
	r.setup("pgclaim: one schedule.Scheduler per instance (default Config) registering the M schedules (`*/10 * * * * *`, or `* * * * * *` every second)")
	r.setup("River: river.NewPeriodicJob with a PeriodicSchedule due at every multiple of the period, riverpgxv5, one client per instance on the same pool size, MaxWorkers %d unless the shape says, River's migrations (rivermigrate); a child process built from harness/bench/herdriver, a Go module of its own", herdRiverWorkers)
	r.setup("robfig: gate.Gate + cronx/robfig per instance, M robfig/cron jobs on the same spec, each through robfig.NewJob (gate.Once per instant)")
	r.setup("each side in a fresh database on a server started with max_connections as given (100: the stock limit); the first measured instant is the first at least 2 s after every instance is ready and at least 11 s plus half a period after it started (an idle backend's statistics come in up to 10 s late); due = M × measured instants; ran = distinct (job, instant) rows; start lag = started − instant (database time); backends = client backends of the side's database in pg_stat_activity, sampled every 100 ms from before the first instance starts, peak; transactions per instant = xact_commit of the database (pg_stat_database) over the measured instants, idle polls and maintenance included")
	tbl := Table{Title: "Herd: M jobs due at one instant on N instances",
		Columns: []string{"shape", "max_connections", "side", "succeeded / due", "duplicates", "lag p50", "lag p99", "lag max", "backends (peak)", "budget", "transactions/instant", "statements/instant", "job errors"}}
	var dups int64
	riverBin, riverWhy := "", ""
	for _, sh := range p.HerdShapes {
		limit := sh.MaxConnections
		if limit == 0 {
			limit = 100
		}
		srv, owned, err := servers.get(ctx, limit)
		if err != nil {
			return err
		}
		shown := fmt.Sprint(limit)
		if !owned {
			shown = "(the server's)"
		}
		res := map[string]herdSide{}
		for _, side := range sh.Sides {
			if side == "river" && riverBin == "" && riverWhy == "" {
				riverBin, riverWhy = buildHerdRiver(ctx, e)
				if riverWhy != "" {
					r.note("River side not run: %s", riverWhy)
				}
			}
			if side == "river" && riverWhy != "" {
				continue
			}
			label := sh.label() + ", " + side
			e.prog.logf("  herd: %s...", label)
			hs, err := herdRun(ctx, srv, sh, side, riverBin)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			res[side] = hs
			dups += hs.dups
			budget := "-"
			switch side {
			case "pgclaim":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + schedDedicated))
				if sh.Bouncer {
					budget = "20 (PgBouncer's pool)"
				}
			case "robfig":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + gateDedicated))
			case "river":
				budget = fmt.Sprint(sh.Instances * (herdPoolConns + riverDedicated))
			}
			stmts := "-"
			if hs.stmtsPerInstant > 0 {
				stmts = fmt.Sprintf("%.0f", hs.stmtsPerInstant)
			}
			name := side
			if side == "river" && hs.riverVersion != "" {
				name = "River " + hs.riverVersion
			}
			jobErrs := fmt.Sprint(hs.errors)
			if hs.startErrors > 0 {
				jobErrs += fmt.Sprintf(" (+%d start-up calls failed)", hs.startErrors)
			}
			tbl.Rows = append(tbl.Rows, []string{sh.label(), shown, name, fmt.Sprintf("%d / %d", hs.ran, hs.due), fmt.Sprint(hs.dups),
				fmtSec(hs.lag.P50), fmtSec(hs.lag.P99), fmtSec(hs.lag.Max), fmt.Sprint(hs.peakBackends), budget,
				fmt.Sprintf("%.0f", hs.xactsPerInstant), stmts, jobErrs})
			group := "pgclaim"
			if side == "river" {
				group = "baseline"
			}
			r.Results = append(r.Results, Result{Group: group, Name: "herd " + label, Workers: sh.Instances, Ops: hs.ran, Unit: "runs",
				P50us: us(hs.lag.P50), P99us: us(hs.lag.P99), MaxUs: us(hs.lag.Max),
				Extra: map[string]float64{"schedules": float64(sh.Schedules), "period_seconds": sh.Period.Seconds(), "due": float64(hs.due),
					"duplicates": float64(hs.dups), "backends_peak": float64(hs.peakBackends), "transactions_per_instant": hs.xactsPerInstant,
					"statements_per_instant": hs.stmtsPerInstant, "job_errors": float64(hs.errors), "max_connections": float64(limit)}})
			if hs.firstError != "" {
				r.note("%s: first error: %s", label, hs.firstError)
			}
			if ev := hs.events; ev != nil {
				r.note("%s: scheduler events: %d started, %d finished, %d skipped, %d missed, %d taken over, %d lost", label,
					ev.get(schedule.EventStarted), ev.get(schedule.EventFinished), ev.get(schedule.EventSkipped),
					ev.get(schedule.EventMissed), ev.get(schedule.EventTakenOver), ev.get(schedule.EventLost))
			}
			for _, d := range hs.dupDetail {
				r.note("%s: duplicate: %s", label, d)
			}
			if hs.warnings != nil {
				if rows := hs.warnings.rows(); len(rows) > 0 {
					if len(rows) > 4 {
						rows = rows[:4]
					}
					r.Tables = append(r.Tables, Table{Title: "Herd warnings and errors logged, " + label + " (most frequent first)",
						Columns: []string{"records", "level, message: error"}, Rows: rows})
				}
			}
		}
		if pg, ok := res["pgclaim"]; ok {
			if rv, ok := res["river"]; ok && rv.lag.P99 > 0 {
				r.note("%s: pgclaim's p99 start lag %s, River's %s (%.2f× River's); backends %d vs %d; transactions per instant %.0f vs %.0f",
					sh.label(), fmtSec(pg.lag.P99), fmtSec(rv.lag.P99), float64(pg.lag.P99)/float64(rv.lag.P99), pg.peakBackends, rv.peakBackends,
					pg.xactsPerInstant, rv.xactsPerInstant)
			}
		}
	}
	r.Tables = append([]Table{tbl}, r.Tables...)
	r.note("budget: pgclaim = N × (MaxConns + schedule's dedicated sessions, %d); robfig = N × (MaxConns + gate's, %d); River = N × (MaxConns + its LISTEN connection, %d, which riverpgxv5 hijacks from the pool)", schedDedicated, gateDedicated, riverDedicated)
	r.check("herd: (job, instant) rows beyond the first", 0, dups)
	return nil
}

func fmtSec(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f s", d.Seconds())
}
