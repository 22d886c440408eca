package bench

// The herd's in-process instances: pgclaim's schedulers and the robfig
// crons with a gate, each on a pool that counts its statements.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/robfig"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/schedule"
)

// herdSchedulers starts sh.Instances schedulers, each registering the
// shape's schedules, and returns once every one runs.
func herdSchedulers(ctx context.Context, url string, sh herdShape, errs *herdErrs, events *schedEvents) (stop func() error, stmts func() int64, startErrs int64, logs *logCount, err error) {
	logs = newLogCount()
	log := slog.New(logs)
	type inst struct {
		in     *schedInstance
		s      *schedule.Scheduler
		cancel context.CancelFunc
		done   chan error
	}
	insts := make([]*inst, sh.Instances)
	closeAll := func() {
		for _, it := range insts {
			if it != nil && it.in != nil {
				it.in.pool.Close()
			}
		}
	}
	var failed atomic.Int64
	// Registration is bounded as a whole: on a full server every Register
	// may wait out its retries, and the phase must still end.
	regCtx, regCancel := context.WithTimeout(ctx, time.Minute+time.Duration(sh.Schedules)*20*time.Millisecond)
	defer regCancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range sh.Instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, err := herdPool(ctx, url)
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			in.count.trace, in.count.inst = herdTrace, i
			it := &inst{in: in, done: make(chan error, 1)}
			insts[i] = it
			s, err := schedule.New(in.pool, schedule.Config{Holder: fmt.Sprintf("herd-%d", sh.HolderFrom+i), Logger: log, Hooks: events, LeaseLocks: sh.Bouncer, MaxConcurrent: sh.MaxConcurrent})
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
			it.s = s
			for k := range sh.Schedules {
				name := fmt.Sprintf("herd-%d", k)
				job := func(ctx context.Context, run schedule.Run) error {
					return herdEffect(ctx, in.pool, run.Schedule, run.Instant, herdRunInfo{run.Holder, run.Attempt, run.Fence}, errs)
				}
				err := s.Register(regCtx, schedule.Definition{Name: name, Spec: sh.spec(), Version: 1}, job)
				if err != nil {
					if failed.Add(1) == 1 {
						errs.mu.Lock()
						if errs.first == "" {
							errs.first = "Register: " + firstLine(err.Error())
						}
						errs.mu.Unlock()
					}
				}
			}
			runCtx, cancel := context.WithCancel(ctx)
			it.cancel = cancel
			go func() { it.done <- s.Run(runCtx) }()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		closeAll()
		return nil, nil, 0, nil, firstErr
	}
	stop = func() error {
		defer herdTrace.flush()
		var err error
		for _, it := range insts {
			if it.cancel != nil {
				it.cancel()
			}
		}
		deadline := time.After(30 * time.Second)
		for _, it := range insts {
			if it.cancel == nil {
				continue
			}
			select {
			case e := <-it.done:
				if e != nil && !errors.Is(e, context.Canceled) {
					err = cmpErr(err, e)
				}
			case <-deadline:
				err = cmpErr(err, errors.New("the schedulers did not stop within 30 s"))
				closeAll()
				return err
			}
		}
		closeAll()
		return err
	}
	stmts = func() int64 {
		var n int64
		for _, it := range insts {
			n += it.in.count.n.Load()
		}
		return n
	}
	return stop, stmts, failed.Load(), logs, nil
}

// herdRobfig starts sh.Instances crons, each with a gate and the shape's
// jobs through cronx/robfig.
func herdRobfig(ctx context.Context, url string, sh herdShape, errs *herdErrs) (stop func() error, stmts func() int64, startErrs int64, logs *logCount, err error) {
	logs = newLogCount()
	log := slog.New(logs)
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(sh.spec())
	if err != nil {
		return nil, nil, 0, nil, err
	}
	var ins []*schedInstance
	var gates []*gate.Gate
	var crons []*cron.Cron
	// Cancelled first at stop: the runs in progress (a job waiting for a
	// connection of a full server) end, and the crons' Stop returns.
	ctx, cancel := context.WithCancel(ctx)
	closeAll := func() {
		cancel()
		for _, c := range crons {
			select {
			case <-c.Stop().Done():
			case <-time.After(30 * time.Second):
			}
		}
		for _, g := range gates {
			g.Close()
		}
		for _, in := range ins {
			in.pool.Close()
		}
	}
	for i := range sh.Instances {
		in, err := herdPool(ctx, url)
		if err != nil {
			closeAll()
			return nil, nil, 0, nil, err
		}
		ins = append(ins, in)
		g, err := gate.New(in.pool, gate.Config{Holder: fmt.Sprintf("herd-%d", i), Logger: log})
		if err != nil {
			closeAll()
			return nil, nil, 0, nil, err
		}
		gates = append(gates, g)
		c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
		for k := range sh.Schedules {
			name := fmt.Sprintf("herd-%d", k)
			fn := func(ctx context.Context, run gate.Run) error {
				return herdEffect(ctx, in.pool, name, run.FireAt, herdRunInfo{holder: run.Holder, fence: run.Fence}, errs)
			}
			j, err := robfig.NewJob(g, name, sched, fn, robfig.Config{Context: ctx, Location: time.UTC, Logger: log})
			if err != nil {
				startErrs++
				continue
			}
			c.Schedule(sched, j)
		}
		crons = append(crons, c)
	}
	for _, c := range crons {
		c.Start()
	}
	stop = func() error { closeAll(); return nil }
	stmts = func() int64 {
		var n int64
		for _, in := range ins {
			n += in.count.n.Load()
		}
		return n
	}
	return stop, stmts, startErrs, logs, nil
}

func cmpErr(have, err error) error {
	if have != nil {
		return have
	}
	return err
}

// The dedicated sessions an instance holds besides its pool, by the
// packages' documented budgets.
const (
	schedDedicated = schedule.DedicatedSessions
	gateDedicated  = gate.DedicatedSessions
	riverDedicated = 1 // a River client's listener (riverpgxv5 hijacks it from the pool)
)

// herdPool is an instance's pool with a statement counter. It does not
// connect: on a full server the instance starts anyway, and what it then
// cannot do is what the scenario reports.
func herdPool(ctx context.Context, url string) (*schedInstance, error) {
	c := &stmtCounter{}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = herdPoolConns
	pc.ConnConfig.Tracer = c
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &schedInstance{pool: p, count: c}, nil
}
