package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// faultWeights is how often each event fault is drawn, relative to the
// others.
var faultWeights = map[Fault]int{
	FaultKill:      3,
	FaultTerminate: 3,
	FaultPause:     2,
	FaultSchedule:  2,
	FaultClock:     2,
	FaultRestart:   1,
	FaultExhaust:   1,
}

// minRestartGap keeps Postgres restarts apart, so the system makes progress
// between them.
const minRestartGap = 10 * time.Second

// inject draws faults from rng until ctx ends. The schedule (which fault,
// which instance, how long) comes from the seed; when a drawn instance is
// not eligible (already killed or paused) the next eligible one is taken.
// At most Instances-1 instances are down (killed or paused) at once.
func (h *harness) inject(ctx context.Context, rng *rand.Rand) {
	var kinds []Fault
	total := 0
	for _, f := range AllFaults {
		if w := faultWeights[f]; w > 0 && slices.Contains(h.cfg.Faults, f) {
			kinds = append(kinds, f)
			total += w
		}
	}
	if len(kinds) == 0 {
		<-ctx.Done()
		return
	}
	lastRestart := time.Now()
	for {
		wait := time.Duration((0.5 + rng.Float64()) * float64(h.cfg.FaultEvery))
		// Draw everything up front, so the schedule does not depend on
		// what the processes did meanwhile.
		pick := rng.IntN(total)
		var kind Fault
		for _, k := range kinds {
			if pick < faultWeights[k] {
				kind = k
				break
			}
			pick -= faultWeights[k]
		}
		target := rng.IntN(len(h.insts))
		r1 := rng.Float64()
		nTerm := 1 + rng.IntN(3)
		offset := randOffset(rng, h.cfg.MaxOffset)
		if !sleepCtx(ctx, wait) {
			return
		}
		switch kind {
		case FaultKill:
			h.killFault(ctx, target, r1)
		case FaultPause:
			h.pauseFault(ctx, target, r1)
		case FaultSchedule:
			h.schedulePauseFault(ctx, r1)
		case FaultTerminate:
			h.terminateFault(ctx, nTerm, rng)
		case FaultExhaust:
			h.exhaustFault(ctx, r1)
		case FaultClock:
			in := h.insts[target]
			in.setOffset(offset)
			h.faults.add(FaultClock, false)
			h.faults.mu.Lock()
			h.faults.offsets = append(h.faults.offsets, offset)
			h.faults.mu.Unlock()
		case FaultRestart:
			if time.Since(lastRestart) < minRestartGap {
				continue
			}
			lastRestart = time.Now()
			// A starved machine's crash recovery can outlast one try,
			// and a try that runs out stops the server: try again, since
			// a server left down ends the run.
			var err error
			for try := 0; try < 3; try++ {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
				err = h.srv.Restart(rctx)
				cancel()
				if err == nil {
					break
				}
				h.logf("restart Postgres (try %d): %v", try+1, err)
			}
			if err != nil {
				h.logf("restart Postgres: %v", err)
				continue
			}
			h.faults.add(FaultRestart, false)
			h.faults.mu.Lock()
			h.faults.restarts = append(h.faults.restarts, lastRestart)
			h.faults.mu.Unlock()
		}
	}
}

// down counts instances killed or paused.
func (h *harness) down() int {
	n := 0
	for _, in := range h.insts {
		if s := in.getState(); s == stateKilled || s == statePaused {
			n++
		}
	}
	return n
}

// eligible returns the first running instance from index i on, or nil.
func (h *harness) eligible(i int) *instance {
	if h.down() >= len(h.insts)-1 {
		return nil
	}
	for k := 0; k < len(h.insts); k++ {
		in := h.insts[(i+k)%len(h.insts)]
		if in.getState() == stateRunning {
			return in
		}
	}
	return nil
}

// pickBusy returns the instance a kill or pause should hit: the first
// running instance from index i on that is inside a batch (holding claims)
// or, with inRun, running a schedule's job; waiting up to three seconds for
// one; failing that, the first running one.
func (h *harness) pickBusy(ctx context.Context, i int, inRun bool) *instance {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if h.down() >= len(h.insts)-1 {
			return nil
		}
		for k := 0; k < len(h.insts); k++ {
			in := h.insts[(i+k)%len(h.insts)]
			busy := in.inBatch.Load()
			if inRun {
				busy = in.inRuns.Load() > 0
			}
			if in.getState() == stateRunning && busy {
				return in
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return h.eligible(i)
}

func (h *harness) killFault(ctx context.Context, target int, r float64) {
	in := h.pickBusy(ctx, target, false)
	if in == nil {
		return
	}
	hit, ok := in.kill()
	if !ok {
		return
	}
	h.faults.add(FaultKill, hit.midBatch)
	h.faults.mu.Lock()
	h.faults.kills = append(h.faults.kills, hit)
	h.faults.mu.Unlock()
	delay := 300*time.Millisecond + time.Duration(r*float64(2700*time.Millisecond))
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping {
		return
	}
	h.restarts.Add(1)
	go func() {
		defer h.restarts.Done()
		time.Sleep(delay)
		h.mu.Lock()
		stopping := h.stopping
		h.mu.Unlock()
		if stopping {
			return
		}
		if err := in.start(); err != nil {
			h.logf("restart instance %s: %v", in.name, err)
		}
	}()
}

func (h *harness) pauseFault(ctx context.Context, target int, r float64) {
	// Every other pause waits for a schedule's job rather than a batch, so
	// runners stopped past their lease are among the faults of every run
	// with schedules (a job is shorter than a batch and rarely hit by
	// chance).
	h.pauses++
	inRun := h.pauses%2 == 0 && len(h.cfg.scheduleNames()) > 0
	in := h.pickBusy(ctx, target, inRun)
	if in == nil {
		return
	}
	hit, ok := in.pause()
	if !ok {
		return
	}
	h.faults.add(FaultPause, hit.midBatch)
	h.faults.mu.Lock()
	h.faults.stops = append(h.faults.stops, stop{hit: hit})
	h.faults.mu.Unlock()
	lo, hi := h.cfg.pauseRange()
	d := lo + time.Duration(r*float64(hi-lo))
	h.restarts.Add(1)
	go func() {
		defer h.restarts.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		h.faults.resumed(hit.holder, in.resume())
	}()
}

// schedulePauseFault pauses a schedule that is running a job (any one when
// none is), through Scheduler.Pause, and resumes it 2-4 s later. The pause
// is recorded in chaos_sched_pauses with the database times at which it
// was committed and the resume began.
func (h *harness) schedulePauseFault(ctx context.Context, r float64) {
	names := h.cfg.scheduleNames()
	if len(names) == 0 || h.sched == nil {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	name := names[int(r*float64(len(names)))%len(names)]
	var running string
	if err := h.pool.QueryRow(qctx, `SELECT schedule FROM pgclaim_schedule_runs
		WHERE schedule LIKE $1 AND state = 'running' ORDER BY random() LIMIT 1`, schedPrefix+"%").Scan(&running); err == nil {
		name = running
	}
	h.faults.mu.Lock()
	if h.faults.paused[name] {
		h.faults.mu.Unlock()
		return
	}
	h.faults.paused[name] = true
	h.faults.mu.Unlock()
	if err := h.sched.Pause(qctx, name, "chaos: paused mid-run", harnessAppName); err != nil {
		// A pause whose answer did not come (a deadline on a starved
		// server, a restart) may have committed: left so, the schedule
		// would stay paused, its instants unrecorded, and the pause not
		// in chaos_sched_pauses. Look, and resume it as any other.
		var paused bool
		var lerr error
		retry(context.WithoutCancel(ctx), func(ctx context.Context) error {
			lerr = h.pool.QueryRow(ctx, `SELECT coalesce(paused AND paused_by = $2, false) FROM pgclaim_schedules WHERE name = $1`, name, harnessAppName).Scan(&paused)
			return lerr
		})
		if lerr != nil {
			h.logf("pause schedule %s: %v (committed: unknown, the look-up failed for a minute: %v)", name, err, lerr)
		} else {
			h.logf("pause schedule %s: %v (committed: %v)", name, err, paused)
		}
		if !paused {
			h.faults.mu.Lock()
			delete(h.faults.paused, name)
			h.faults.mu.Unlock()
			return
		}
	}
	midRun := running != ""
	h.faults.add(FaultSchedule, midRun)
	h.restarts.Add(1)
	go func() {
		defer h.restarts.Done()
		// Whatever happens meanwhile (a restart), the schedule ends up
		// resumed and its pause recorded.
		bg := context.WithoutCancel(ctx)
		var pausedAt time.Time
		retry(bg, func(ctx context.Context) error { return h.pool.QueryRow(ctx, "SELECT now()").Scan(&pausedAt) })
		d := 2*time.Second + time.Duration(r*float64(2*time.Second))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		var resumedAt time.Time
		retry(bg, func(ctx context.Context) error {
			if err := h.pool.QueryRow(ctx, "SELECT now()").Scan(&resumedAt); err != nil {
				return err
			}
			return h.sched.Resume(ctx, name)
		})
		retry(bg, func(ctx context.Context) error {
			_, err := h.pool.Exec(ctx, `INSERT INTO chaos_sched_pauses (schedule, paused_at, resumed_at) VALUES ($1, $2, $3)`,
				name, pausedAt, resumedAt)
			return err
		})
		h.faults.mu.Lock()
		delete(h.faults.paused, name)
		h.faults.mu.Unlock()
	}()
}

// retry runs fn until it succeeds (each try bounded to 5 s), for up to a
// minute: long enough to outlast a Postgres restart.
func retry(ctx context.Context, fn func(ctx context.Context) error) {
	deadline := time.Now().Add(time.Minute)
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := fn(tctx)
		cancel()
		if err == nil || time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
	}
}

// terminateFault ends n random backends of the instances (found by
// application_name; behind PgBouncer, the server connections it last lent
// to an instance).
func (h *harness) terminateFault(ctx context.Context, n int, rng *rand.Rand) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := h.pool.Query(qctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE $1 AND pid <> pg_backend_pid()
		ORDER BY pid`, appNamePrefix+"%")
	if err != nil {
		return
	}
	var pids []uint32
	for rows.Next() {
		var pid uint32
		if rows.Scan(&pid) == nil {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	if len(pids) == 0 {
		return
	}
	ended := 0
	for i := 0; i < n && len(pids) > 0; i++ {
		k := rng.IntN(len(pids))
		if err := h.terminate(qctx, pids[k]); err == nil {
			ended++
		}
		pids = slices.Delete(pids, k, k+1)
	}
	if ended > 0 {
		h.faults.add(FaultTerminate, false)
		h.faults.mu.Lock()
		h.faults.terminated += ended
		h.faults.mu.Unlock()
	}
}

// terminate ends backend pid: through pgtest, or on the Patroni primary.
func (h *harness) terminate(ctx context.Context, pid uint32) error {
	if h.srv != nil {
		return h.srv.Terminate(ctx, pid)
	}
	q := "SELECT pg_terminate_backend($1, 5000)"
	var v int
	if err := h.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err == nil && v < 140000 {
		q = "SELECT pg_terminate_backend($1)" // 13 has no timeout argument
	}
	var ok bool
	if err := h.pool.QueryRow(ctx, q, int32(pid)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("chaos: terminate backend %d: no such backend", pid)
	}
	return nil
}

func (h *harness) faultCounts() []FaultCount {
	f := h.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []FaultCount
	for _, k := range slices.Concat(AllFaults, PatroniFaults) {
		if !slices.Contains(h.cfg.Faults, k) {
			continue
		}
		fc := FaultCount{Kind: k, Count: f.n[k]}
		switch k {
		case FaultKill:
			fc.Detail = fmt.Sprintf("%d mid-batch, %d mid-run; restarted after 0.3-3s, start-up sweep", f.midBatch[k], f.midRun(f.kills))
		case FaultPause:
			lo, hi := h.cfg.pauseRange()
			var hits []hit
			for _, s := range f.stops {
				hits = append(hits, s.hit)
			}
			fc.Detail = fmt.Sprintf("%d mid-batch, %d mid-run; stopped %.1f-%.1fs (leases 2s)", f.midBatch[k], f.midRun(hits), lo.Seconds(), hi.Seconds())
		case FaultTerminate:
			fc.Detail = fmt.Sprintf("%d backends ended", f.terminated)
		case FaultRestart:
			fc.Detail = "immediate stop + start"
		case FaultSchedule:
			fc.Detail = fmt.Sprintf("%d mid-run; Scheduler.Pause, Resume 2-4s later", f.midBatch[k])
		case FaultClock:
			fc.Detail = fmt.Sprintf("offsets within ±%s (plus one per instance at start)", h.cfg.MaxOffset)
		case FaultSwitchover:
			fc.Detail = "POST /switchover to the replica (Patroni's REST API); refusals are not counted"
		case FaultFailover:
			fc.Detail = "SIGKILL of the primary's postmaster; Patroni fails over (primary_start_timeout 0), the old primary rejoins"
		case FaultLag:
			fc.Detail = "SIGSTOP of the primary's WAL senders for 0.2-1.2s, then SIGKILL of its postmaster and WAL senders; Patroni may restart a primary in place instead (see patroni below)"
		case FaultSilent:
			fc.Detail = "SIGSTOP of the primary's Patroni and every PostgreSQL process until the replica is promoted (+0-2s), then SIGKILL and a new Patroni"
		case FaultBouncer:
			fc.Count = h.cfg.Bouncer
			fc.Detail = "instances behind PgBouncer (transaction pooling): lease gate + lease elector"
		}
		out = append(out, fc)
	}
	return out
}

// exhaustFault takes every connection the server will give (as a superuser:
// the instances are refused with 53300 "too many clients") and holds them
// for 2-5 s, then closes them: a full server, as another application's
// burst makes it.
func (h *harness) exhaustFault(ctx context.Context, r float64) {
	const most = 1000
	var (
		mu    sync.Mutex
		conns []*pgx.Conn
		full  atomic.Bool
		wg    sync.WaitGroup
	)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !full.Load() && cctx.Err() == nil {
				c, err := pgx.Connect(cctx, h.pool.Config().ConnString())
				if err != nil {
					full.Store(true) // refused: the server is full
					return
				}
				mu.Lock()
				conns = append(conns, c)
				if len(conns) >= most {
					full.Store(true)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	held := len(conns)
	sleepCtx(ctx, time.Duration((2+3*r)*float64(time.Second)))
	for _, c := range conns {
		_ = c.Close(context.Background())
	}
	if held > 0 {
		h.faults.add(FaultExhaust, false)
		h.logf("exhaust: held %d connections", held)
	}
}
