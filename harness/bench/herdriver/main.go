package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// herdArgs names the schedule a job belongs to.
type herdArgs struct {
	Name string `json:"name"`
}

func (herdArgs) Kind() string { return "pgclaim_herd" }

// herdWorker inserts one row through its client's pool, stamped with the
// database's clock_timestamp(), then sleeps.
type herdWorker struct {
	river.WorkerDefaults[herdArgs]
	pool   *pgxpool.Pool
	table  string
	sleep  time.Duration
	worked *atomic.Int64
	errs   *errCount
}

func (w *herdWorker) Work(ctx context.Context, job *river.Job[herdArgs]) error {
	// River inserts a periodic job with ScheduledAt = its instant.
	_, err := w.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{w.table}.Sanitize()+" (name, instant, started) VALUES ($1, $2, clock_timestamp())",
		job.Args.Name, job.ScheduledAt)
	if err != nil {
		w.errs.add(err)
		return err
	}
	w.worked.Add(1)
	select {
	case <-time.After(w.sleep):
	case <-ctx.Done():
	}
	return nil
}

// everyPeriod is a PeriodicSchedule due at every multiple of a period.
type everyPeriod time.Duration

func (p everyPeriod) Next(t time.Time) time.Time {
	return t.Truncate(time.Duration(p)).Add(time.Duration(p))
}

type errCount struct {
	mu    sync.Mutex
	n     int64
	first string
}

func (e *errCount) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if e.first == "" {
		e.first = err.Error()
	}
}

type done struct {
	Event      string `json:"event"`
	Worked     int64  `json:"worked"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	Clients    int    `json:"clients"`
	Version    string `json:"version"`
}

// runMigrations brings River's own tables up to date.
func runMigrations(ctx context.Context, pool *pgxpool.Pool) error {
	mig, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = mig.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func main() {
	url := flag.String("url", "", "database URL")
	instances := flag.Int("instances", 8, "River clients, each with its own pool")
	schedules := flag.Int("schedules", 50, "periodic jobs each client registers")
	period := flag.Duration("period", 10*time.Second, "the jobs are due at every multiple of this")
	poolSize := flag.Int("pool", 4, "MaxConns of each client's pool")
	workers := flag.Int("workers", 20, "MaxWorkers of each client's queue")
	sleep := flag.Duration("sleep", 200*time.Millisecond, "how long a job sleeps after its insert")
	prefix := flag.String("prefix", "river", "schedule names are PREFIX-0 … PREFIX-(M-1)")
	table := flag.String("table", "herd_effects", "the table each job inserts its row into")
	mode := flag.String("mode", "herd", "herd (periodic jobs) or latency (one idle client, a job inserted every -interval: see latency.go)")
	samplesN := flag.Int("samples", 100, "latency: jobs inserted")
	interval := flag.Duration("interval", 100*time.Millisecond, "latency: time between two inserts")
	cooldown := flag.Duration("cooldown", 0, "latency: the clients' FetchCooldown (0: River's default)")
	flag.Parse()
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) {
		_ = out.Encode(map[string]string{"event": "error", "error": err.Error()})
		os.Exit(1)
	}
	if *url == "" {
		fail(errors.New("-url is required"))
	}
	ctx := context.Background()

	if *mode == "latency" {
		runLatency(ctx, *url, *samplesN, *interval, *cooldown, *poolSize, out, fail)
		return
	}
	if *mode != "herd" {
		fail(fmt.Errorf("-mode %q: want herd or latency", *mode))
	}

	// River's own tables, once.
	migrate(ctx, *url, fail)

	var worked atomic.Int64
	errs := &errCount{}
	var clients []*river.Client[pgx.Tx]
	var pools []*pgxpool.Pool
	for i := range *instances {
		pc, err := pgxpool.ParseConfig(*url)
		if err != nil {
			fail(err)
		}
		pc.MaxConns = int32(*poolSize)
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			fail(err)
		}
		pools = append(pools, pool)
		ws := river.NewWorkers()
		river.AddWorker(ws, &herdWorker{pool: pool, table: *table, sleep: *sleep, worked: &worked, errs: errs})
		var pjs []*river.PeriodicJob
		for k := range *schedules {
			name := fmt.Sprintf("%s-%d", *prefix, k)
			pjs = append(pjs, river.NewPeriodicJob(everyPeriod(*period),
				func() (river.JobArgs, *river.InsertOpts) { return herdArgs{Name: name}, nil }, nil))
		}
		c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			ID:           fmt.Sprintf("herd-%d", i),
			Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
			Workers:      ws,
			PeriodicJobs: pjs,
			Logger:       slog.New(slog.DiscardHandler),
		})
		if err != nil {
			fail(err)
		}
		if err := c.Start(ctx); err != nil {
			fail(err)
		}
		clients = append(clients, c)
	}
	_ = out.Encode(map[string]string{"event": "ready"})

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "stop" {
			break
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Stop(sctx)
		}()
	}
	wg.Wait()
	for _, p := range pools {
		p.Close()
	}
	e := errs
	e.mu.Lock()
	_ = out.Encode(done{Event: "done", Worked: worked.Load(), Errors: e.n, FirstError: e.first, Clients: len(clients), Version: riverVersion()})
	e.mu.Unlock()
}

// riverVersion is the River module this binary was built with.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}
