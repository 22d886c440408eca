package chaos

// The Patroni mode's faults (switchover, failover by SIGKILL, a silent
// host), what the harness watches meanwhile (no two writable primaries;
// acknowledgements the instances report) and what it checks and measures
// at the end.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The Patroni mode's fault kinds (Config.Patroni).
const (
	FaultSwitchover Fault = "switchover" // a planned switchover through Patroni's REST API
	FaultFailover   Fault = "failover"   // SIGKILL of the primary's postmaster; Patroni fails over
	FaultSilent     Fault = "silent"     // the primary's host goes silent (SIGSTOP of all its processes) until the replica is promoted, then dies
	FaultLag        Fault = "lag"        // the primary's WAL sender stalls (SIGSTOP, 0.2-1.2 s), then the primary dies (SIGKILL) with the WAL it did not send
)

// PatroniFaults lists the Patroni mode's fault kinds, in report order: the
// default faults with Config.Patroni.
var PatroniFaults = []Fault{FaultSwitchover, FaultFailover, FaultSilent, FaultLag}

// patroniDB names the workload's database on the Patroni cluster.
const patroniDB = "chaos"

// Names of the Patroni mode's checks.
const (
	checkPatroniConfig = "patroni: configured to fail over at once and rewind the old primary"
	checkPatroniDual   = "patroni: never two writable primaries (both nodes sampled every 100 ms)"
	checkPatroniRejoin = "patroni: every fault promoted the replica; the old primary rejoined as a replica of the new timeline"
	checkPatroniLost   = "replication: no acknowledged finish or schedule run lost (synchronous_mode)"
)

// promotion is one Patroni fault and what followed it.
type promotion struct {
	kind                             Fault
	from, to                         string
	at, promoted, healthy            time.Time
	firstWrite, firstClaim, firstRun time.Time // first after the promotion
}

// ack is a commit an instance reported acknowledged: a DONE finish of a
// row, or a schedule run's success.
type ack struct {
	holder string
	fence  int64
}

// patroniRun is the harness's side of the Patroni mode.
type patroniRun struct {
	c    *patroniCluster
	sync bool
	logf func(string, ...any)

	mu       sync.Mutex
	events   []*promotion
	refused  map[Fault]int
	rows     map[int64]ack
	runs     map[runKey]ack
	dual     Check
	rejoin   Check
	conf     Check
	tlStart  int64
	sampling sync.WaitGroup
}

func startPatroniRun(ctx context.Context, dir string, sync bool, logf func(string, ...any)) (*patroniRun, error) {
	c, err := startPatroni(ctx, dir, sync, logf)
	if err != nil {
		return nil, err
	}
	p := &patroniRun{c: c, sync: sync, logf: logf, refused: map[Fault]int{}, rows: map[int64]ack{}, runs: map[runKey]ack{},
		dual: Check{Name: checkPatroniDual}, rejoin: Check{Name: checkPatroniRejoin}, conf: Check{Name: checkPatroniConfig}}
	if err := c.createDatabase(ctx, patroniDB); err != nil {
		c.stop()
		return nil, err
	}
	p.checkConfig()
	p.tlStart, _ = c.timeline(ctx, c.nodes[0])
	return p, nil
}

func (p *patroniRun) stop() { p.c.stop() }

// checkConfig verifies, through the REST API, that Patroni is set up to
// keep the old primary from taking writes again: it fails over as soon as
// the primary's postmaster dies (primary_start_timeout 0), rewinds the old
// primary before it follows (use_pg_rewind; a failed rewind is repaired by
// a base backup, set in the nodes' files), and runs the asked replication
// mode.
func (p *patroniRun) checkConfig() {
	ck := &p.conf
	prim := p.c.primary()
	if prim == nil {
		ck.fail("no node answers /primary")
		return
	}
	m, err := p.c.config(prim)
	if err != nil {
		ck.fail("GET /config: %v", err)
		return
	}
	pg, _ := m["postgresql"].(map[string]any)
	want := []struct {
		what      string
		got, want any
	}{
		{"postgresql.use_pg_rewind", pg["use_pg_rewind"], true},
		{"primary_start_timeout", m["primary_start_timeout"], float64(0)},
		{"synchronous_mode", m["synchronous_mode"], p.sync},
	}
	for _, w := range want {
		ck.Checked++
		got := w.got
		if got == nil && w.want == false {
			got = false // unset: off
		}
		if got != w.want {
			ck.fail("%s is %v, want %v", w.what, w.got, w.want)
		}
	}
}

// injectPatroni draws the Patroni faults from rng until ctx ends, one at
// a time: each waits for the cluster to be whole again (the old primary a
// replica of the new timeline, the synchronous standby in sync mode)
// before the pause to the next. h.faults.restarts records each, so the
// schedules' takeover bound excuses runs it delayed.
func (h *harness) injectPatroni(ctx context.Context, rng *rand.Rand) {
	var kinds []Fault
	for _, f := range PatroniFaults {
		if slices.Contains(h.cfg.Faults, f) {
			kinds = append(kinds, f)
		}
	}
	if len(kinds) == 0 {
		return
	}
	for {
		wait := time.Duration((0.5 + rng.Float64()) * float64(h.cfg.FaultEvery))
		kind := kinds[rng.IntN(len(kinds))]
		extra := time.Duration(rng.Float64() * float64(2*time.Second))
		if !sleepCtx(ctx, wait) {
			return
		}
		h.patroniFault(context.WithoutCancel(ctx), kind, extra)
	}
}

// patroniFault injects one fault and waits for the cluster to recover.
func (h *harness) patroniFault(ctx context.Context, kind Fault, extra time.Duration) {
	p, c := h.pat, h.pat.c
	old := c.primary()
	if old == nil {
		h.logf("patroni: no primary before %s; waiting for the cluster", kind)
		p.waitHealthy(ctx, nil)
		return
	}
	nw := c.other(old)
	e := &promotion{kind: kind, from: old.name, to: nw.name, at: time.Now()}
	var refused chan error // the switchover's answer
	switch kind {
	case FaultSwitchover:
		p.mu.Lock()
		p.events = append(p.events, e)
		p.mu.Unlock()
		// Patroni answers once the switchover is done: the promotion is
		// watched meanwhile, so its time is the new primary's, not the
		// answer's.
		refused = make(chan error, 1)
		go func() { refused <- c.switchover(old, nw) }()
	case FaultFailover:
		pm := old.postmaster()
		if pm == 0 || syscall.Kill(pm, syscall.SIGKILL) != nil {
			h.logf("patroni: no postmaster on %s to kill", old.name)
			return
		}
		p.mu.Lock()
		p.events = append(p.events, e)
		p.mu.Unlock()
	case FaultLag:
		// A replica behind: what the primary commits while its WAL
		// sender is stopped never reaches the replica (asynchronous
		// mode: those commits were acknowledged; synchronous: they wait
		// for the standby, and are not). The sender is stopped on the
		// primary's side: WAL already sent waits in the replica's
		// socket buffer and is not lost.
		ws := old.walSenders()
		pm := old.postmaster()
		if len(ws) == 0 || pm == 0 {
			h.logf("patroni: no WAL sender or postmaster on %s", old.name)
			return
		}
		for _, w := range ws {
			_ = syscall.Kill(w, syscall.SIGSTOP)
		}
		time.Sleep(200*time.Millisecond + extra/2)
		e.at = time.Now()
		err := syscall.Kill(pm, syscall.SIGKILL)
		for _, w := range ws {
			_ = syscall.Kill(w, syscall.SIGKILL)
		}
		if err != nil {
			return
		}
		p.mu.Lock()
		p.events = append(p.events, e)
		p.mu.Unlock()
	case FaultSilent:
		// The whole host: Patroni first (it must not react), then the
		// postmaster and every backend; connections stay open and
		// nothing answers.
		old.signalPatroni(syscall.SIGSTOP)
		old.signalPostgres(syscall.SIGSTOP)
		p.mu.Lock()
		p.events = append(p.events, e)
		p.mu.Unlock()
	}
	var err error
	if refused != nil {
		err = p.waitSwitchover(ctx, nw, refused)
		if err != nil {
			// Refused (a candidate not yet synchronous, say): counted,
			// not a fault.
			h.logf("patroni: %v", err)
			p.mu.Lock()
			p.refused[kind]++
			p.events = p.events[:len(p.events)-1]
			p.mu.Unlock()
			p.waitHealthy(ctx, nil)
			return
		}
	}
	h.faults.add(kind, false)
	h.faults.mu.Lock()
	h.faults.restarts = append(h.faults.restarts, e.at)
	h.faults.mu.Unlock()

	if kind == FaultLag {
		if err = p.waitFailover(ctx, old, nw); errors.Is(err, errNoFailover) {
			// Patroni found the replica too far behind
			// (maximum_lag_on_failover) and restarted the old primary in
			// place: its own rule, counted, not a fault.
			h.logf("patroni: %s: %v", kind, err)
			p.mu.Lock()
			p.refused[kind]++
			p.events = slices.DeleteFunc(p.events, func(x *promotion) bool { return x == e })
			p.mu.Unlock()
			p.waitHealthy(ctx, nil)
			return
		}
	}
	if err == nil {
		err = c.waitRole(ctx, nw, "primary", 90*time.Second)
	}
	p.mu.Lock()
	p.rejoin.Checked++
	if err == nil {
		e.promoted = time.Now()
	} else {
		p.rejoin.fail("%s at %s: %s not promoted within 90s", kind, e.at.Format(time.TimeOnly), nw.name)
	}
	p.mu.Unlock()
	if kind == FaultSilent {
		// The stopped host stays silent a little longer, then dies; its
		// Patroni is started again and must rejoin it as a replica.
		time.Sleep(extra)
		c.killNode(ctx, old)
		if err := c.startNode(old); err != nil {
			h.logf("patroni: %v", err)
		}
	}
	if err == nil {
		if herr := p.waitHealthy(ctx, nw); herr != nil {
			p.mu.Lock()
			p.rejoin.fail("%s at %s: %v", kind, e.at.Format(time.TimeOnly), herr)
			p.mu.Unlock()
		}
	} else {
		p.waitHealthy(ctx, nil)
	}
	p.mu.Lock()
	e.healthy = time.Now()
	p.mu.Unlock()
	h.logf("patroni: %s %s → %s: promoted after %s, whole again after %s", kind, old.name, nw.name,
		durOr(e.promoted, e.at), e.healthy.Sub(e.at).Round(time.Millisecond))
}

// errNoFailover: Patroni restarted the primary in place instead of
// promoting the replica.
var errNoFailover = errors.New("the old primary was restarted in place; no failover")

// waitFailover waits until nw is the primary, or old is again.
func (p *patroniRun) waitFailover(ctx context.Context, old, nw *patroniNode) error {
	deadline := time.Now().Add(90 * time.Second)
	down := false // old's REST API answers /primary until Patroni sees the crash
	for !p.c.is(nw, "primary") {
		if !p.c.is(old, "primary") {
			down = true
		} else if down {
			return errNoFailover
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not primary after 90s", nw.name)
		}
		if !sleepCtx(ctx, 25*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// waitSwitchover waits until nw is the primary, or the switchover's
// answer says it was refused.
func (p *patroniRun) waitSwitchover(ctx context.Context, nw *patroniNode, answer chan error) error {
	deadline := time.Now().Add(90 * time.Second)
	for !p.c.is(nw, "primary") {
		select {
		case err := <-answer:
			if err != nil {
				return err
			}
			answer = nil // done: the REST API says so before /primary does
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("switchover to %s: not primary after 90s", nw.name)
		}
		if !sleepCtx(ctx, 25*time.Millisecond) {
			return ctx.Err()
		}
	}
	if answer != nil {
		if err := <-answer; err != nil {
			p.logf("patroni: %s is primary, but the switchover answered %v", nw.name, err)
		}
	}
	return nil
}

func durOr(t, from time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(from).Round(time.Millisecond).String()
}

// waitHealthy waits (up to two minutes) until prim (or, nil, whichever
// node) is the primary, the other node a replica (the synchronous standby
// in sync mode) whose WAL receiver streams the primary's timeline.
func (p *patroniRun) waitHealthy(ctx context.Context, prim *patroniNode) error {
	c := p.c
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pr := prim
		if pr == nil {
			pr = c.primary()
		}
		if pr != nil && c.is(pr, "primary") {
			rep := c.other(pr)
			role := "replica"
			if p.sync {
				role = "sync"
			}
			if c.is(rep, role) {
				tl, err1 := c.timeline(ctx, pr)
				rtl, err2 := c.receivedTimeline(ctx, rep)
				if err1 == nil && err2 == nil && tl == rtl {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not whole again after 2m (logs: %s)", c.logDir)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// timeline is the primary's current timeline, read from its WAL insert
// location (pg_control_checkpoint() lags after a promotion).
func (c *patroniCluster) timeline(ctx context.Context, n *patroniNode) (int64, error) {
	return queryInt(ctx, n, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::int`)
}

// receivedTimeline is the timeline a replica's WAL receiver streams.
func (c *patroniCluster) receivedTimeline(ctx context.Context, n *patroniNode) (int64, error) {
	return queryInt(ctx, n, `SELECT received_tli FROM pg_stat_wal_receiver WHERE status = 'streaming'`)
}

func queryInt(ctx context.Context, n *patroniNode, sql string) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, n.url("postgres"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var v int64
	err = conn.QueryRow(qctx, sql).Scan(&v)
	return v, err
}
