package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// The latency mode (-mode latency) is River's side of `pgclaim bench`'s
// latency scenario: one River client (its own pool) idle on the default
// queue, and an insert-only client on another pool inserting one job every
// -interval; the lag of a job is its Work's start minus the moment just
// before its Insert, both read in this process.
//
// Protocol: {"event":"ready"} once the client runs and a warm-up job was
// worked; the bench then measures the idle client and writes "run" on
// stdin; the samples follow, then {"event":"samples","lags_ns":[…],…};
// after stdin closes (or says "stop"), the client stops and
// {"event":"done",…} follows.

type latencyArgs struct {
	N int64 `json:"n"`
}

func (latencyArgs) Kind() string { return "pgclaim_latency" }

// latencyLog records when each job's work started, by its N.
type latencyLog struct {
	mu      sync.Mutex
	started map[int64][]time.Time
	arrived chan struct{}
}

func (l *latencyLog) add(n int64, t time.Time) {
	l.mu.Lock()
	l.started[n] = append(l.started[n], t)
	l.mu.Unlock()
	select {
	case l.arrived <- struct{}{}:
	default:
	}
}

func (l *latencyLog) has(ns ...int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range ns {
		if len(l.started[n]) == 0 {
			return false
		}
	}
	return true
}

type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
	log *latencyLog
}

func (w *latencyWorker) Work(_ context.Context, job *river.Job[latencyArgs]) error {
	w.log.add(job.Args.N, time.Now())
	return nil
}

type samples struct {
	Event      string  `json:"event"`
	LagsNs     []int64 `json:"lags_ns"`
	Inserted   int     `json:"inserted"`
	Worked     int     `json:"worked"`     // distinct jobs of the samples worked
	Duplicates int     `json:"duplicates"` // work calls beyond the first, every job
	Version    string  `json:"version"`
}

func runLatency(ctx context.Context, url string, n int, interval, cooldown time.Duration, poolSize int, out *json.Encoder, fail func(error)) {
	migrate(ctx, url, fail)
	newPool := func(size int, app string) *pgxpool.Pool {
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			fail(err)
		}
		pc.MaxConns = int32(size)
		pc.ConnConfig.RuntimeParams["application_name"] = app
		p, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			fail(err)
		}
		return p
	}
	wpool := newPool(poolSize, "river-latency-worker")
	ipool := newPool(2, "river-latency-inserter")
	log := &latencyLog{started: map[int64][]time.Time{}, arrived: make(chan struct{}, 1)}
	ws := river.NewWorkers()
	river.AddWorker(ws, &latencyWorker{log: log})
	quiet := slog.New(slog.DiscardHandler)
	c, err := river.NewClient(riverpgxv5.New(wpool), &river.Config{
		ID:            "latency-worker",
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:       ws,
		FetchCooldown: cooldown,
		Logger:        quiet,
	})
	if err != nil {
		fail(err)
	}
	// The inserter notifies at most once per FetchCooldown too: it has the
	// same setting.
	ins, err := river.NewClient(riverpgxv5.New(ipool), &river.Config{ID: "latency-inserter", FetchCooldown: cooldown, Logger: quiet})
	if err != nil {
		fail(err)
	}
	if err := c.Start(ctx); err != nil {
		fail(err)
	}
	// Warm-up: one job worked, however the client finds it.
	if _, err := ins.Insert(ctx, latencyArgs{N: -1}, nil); err != nil {
		fail(err)
	}
	if !waitFor(log, 30*time.Second, -1) {
		fail(fmt.Errorf("the warm-up job was not worked within 30 s"))
	}
	_ = out.Encode(map[string]string{"event": "ready"})

	in := bufio.NewScanner(os.Stdin)
	stopped := false
	for {
		if !in.Scan() || in.Text() == "stop" {
			stopped = true
			break
		}
		if in.Text() == "run" {
			break
		}
	}
	if !stopped {
		sent := make([]time.Time, n)
		ns := make([]int64, n)
		t0 := time.Now()
		for i := range n {
			time.Sleep(time.Until(t0.Add(time.Duration(i) * interval)))
			ns[i] = int64(i)
			sent[i] = time.Now()
			if _, err := ins.Insert(ctx, latencyArgs{N: int64(i)}, nil); err != nil {
				fail(err)
			}
		}
		// Every job worked, or FetchPollInterval (1 s) and more later.
		waitFor(log, 5*time.Second, ns...)
		s := samples{Event: "samples", Inserted: n, Version: riverVersion()}
		log.mu.Lock()
		for i := range n {
			if st := log.started[int64(i)]; len(st) > 0 {
				s.LagsNs = append(s.LagsNs, int64(st[0].Sub(sent[i])))
				s.Worked++
			}
		}
		for _, st := range log.started {
			s.Duplicates += max(len(st)-1, 0)
		}
		log.mu.Unlock()
		_ = out.Encode(s)
		for in.Scan() {
			if in.Text() == "stop" {
				break
			}
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = c.Stop(sctx)
	wpool.Close()
	ipool.Close()
	_ = out.Encode(done{Event: "done", Clients: 1, Version: riverVersion()})
}

// waitFor waits until every job of ns was worked, or d has passed.
func waitFor(l *latencyLog, d time.Duration, ns ...int64) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !l.has(ns...) {
		select {
		case <-l.arrived:
		case <-deadline.C:
			return l.has(ns...)
		}
	}
	return true
}

// migrate runs River's migrations on url.
func migrate(ctx context.Context, url string, fail func(error)) {
	mp, err := pgxpool.New(ctx, url)
	if err != nil {
		fail(err)
	}
	defer mp.Close()
	if err := runMigrations(ctx, mp); err != nil {
		fail(fmt.Errorf("river migrations: %w", err))
	}
}
