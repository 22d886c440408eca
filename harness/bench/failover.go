package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	childproc "github.com/pgclaim/pgclaim/harness/child"
)

// Child processes of the failover scenario are this same executable,
// started with these environment variables set; MaybeRunChild turns the
// process into the child.
const (
	envChild    = "PGCLAIM_BENCH_CHILD" // "failover", "instance" or "herd"
	envMode     = "PGCLAIM_BENCH_MODE"  // advisory | lease | poll
	envTTL      = "PGCLAIM_BENCH_TTL"
	envURL      = "PGCLAIM_BENCH_URL"
	envElection = "PGCLAIM_BENCH_ELECTION"
)

// terminateRounds multiplies the rounds of the terminated-backend rows,
// which take milliseconds each and vary more than the TTL-bound ones.
const terminateRounds = 4

// leaderSettle is how long a new leader leads before the next fault: a
// leadership of a few hundred milliseconds at least, as in a service, not
// faults back to back.
const leaderSettle = 200 * time.Millisecond

// pollEvery is the polling baseline's interval: the standby tries
// pg_try_advisory_lock this often, and the leader checks its session.
const pollEvery = 10 * time.Millisecond

// child is a failover child process seen from the parent.
type child struct {
	proc   *childproc.Process
	events chan childEvent // closed when the process has exited
}

type childEvent struct {
	kind string
	at   time.Time
	text string
}

type foVariant struct {
	group, name string
	mode        string // advisory | lease | poll
	ttl         time.Duration
	fault       string // kill | terminate
}

func (v foVariant) ttlText() string {
	if v.mode == "poll" {
		return "poll " + pollEvery.String()
	}
	return v.ttl.String()
}

func startChild(ctx context.Context, v foVariant, url, election string) (*child, error) {
	c := &child{events: make(chan childEvent, 64)}
	proc, err := childproc.Start(childproc.Config{
		Env: []string{envChild + "=failover", envMode + "=" + v.mode, envTTL + "=" + v.ttl.String(), envURL + "=" + url, envElection + "=" + election},
		Stdout: func(line []byte) {
			f := strings.Fields(string(line))
			if len(f) == 0 {
				return
			}
			ev := childEvent{kind: f[0], text: string(line)}
			if len(f) > 1 {
				if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					ev.at = time.Unix(0, ns)
				}
			}
			c.events <- ev
		},
		StderrTo: os.Stderr,
	})
	if err != nil {
		return nil, err
	}
	c.proc = proc
	go func() {
		<-proc.Done()
		close(c.events)
	}()
	return c, nil
}

// wait returns the child's next event of kind, skipping others.
func (c *child) wait(kind string, timeout time.Duration) (childEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return childEvent{}, fmt.Errorf("child %d exited while waiting for %q", c.proc.Pid(), kind)
			}
			if ev.kind == kind {
				return ev, nil
			}
			if ev.kind == "error" {
				return childEvent{}, fmt.Errorf("child %d: %s", c.proc.Pid(), ev.text)
			}
		case <-t.C:
			return childEvent{}, fmt.Errorf("child %d: no %q within %s", c.proc.Pid(), kind, timeout)
		}
	}
}

func (c *child) kill() {
	_ = c.proc.Kill()
	_ = c.proc.Stdin.Close()
	<-c.proc.Done()
}

// runFailover kills the leader process (SIGKILL) or terminates its backend
// and measures the time until a standby process reports that it leads.
func runFailover(ctx context.Context, e *env, p *params, r *ScenarioReport) error {
	db, admin, done, err := e.scratch(ctx, 2)
	if err != nil {
		return err
	}
	defer done()

	var vs []foVariant
	if p.FailoverLong {
		vs = append(vs, foVariant{"pgclaim", "gate.Elector (advisory)", "advisory", gate.DefaultTTL, "kill"})
	}
	short := 500 * time.Millisecond
	vs = append(vs,
		foVariant{"pgclaim", "gate.Elector (advisory)", "advisory", short, "kill"},
		foVariant{"pgclaim", "gate.Elector (advisory)", "advisory", time.Second, "kill"},
		foVariant{"pgclaim", "gate.Elector (advisory)", "advisory", gate.DefaultTTL, "terminate"},
		foVariant{"pgclaim", "gate.Elector (lease)", "lease", short, "kill"},
		foVariant{"pgclaim", "gate.Elector (lease)", "lease", time.Second, "kill"},
	)
	if p.FailoverLong {
		vs = append(vs, foVariant{"pgclaim", "gate.Elector (lease)", "lease", gate.DefaultTTL, "kill"})
	}
	vs = append(vs,
		foVariant{"baseline", "standby polling pg_try_advisory_lock", "poll", 0, "kill"},
		foVariant{"baseline", "standby polling pg_try_advisory_lock", "poll", 0, "terminate"},
	)
	r.setup("two child processes (this executable re-run) campaign for one election: a leader and a standby; %d rounds per row, %d for a terminated backend (a few milliseconds each, and noisier)", p.FailoverRounds, terminateRounds*p.FailoverRounds)
	r.setup("kill: the leader process gets SIGKILL; terminate: pg_terminate_backend on the leader's lock session (the process lives on and becomes the next standby)")
	r.setup("each new leader leads %s before the next fault", leaderSettle)
	r.setup("failover time: from just before the fault to the moment the standby's Campaign returns (its clock, same host)")
	r.setup("gate.Elector (advisory): standbys block in pg_advisory_lock; a new leader waits for the old term to be closed, at most TTL (default %s)", gate.DefaultTTL)
	r.setup("gate.Elector (lease): standbys try the lease every TTL/4")
	r.setup("baseline: a standby polling pg_try_advisory_lock every %s; a leader checking its session as often", pollEvery)

	tbl := Table{Title: "Failover: fault → standby leads",
		Columns: []string{"approach", "fault", "TTL", "rounds", "median", "max", "min", "old leader noticed (median)"}}
	for i, v := range vs {
		election := fmt.Sprintf("bench-election-%d", i)
		rounds := p.FailoverRounds
		if v.fault == "terminate" {
			rounds *= terminateRounds
		}
		res, err := failoverRun(ctx, e, admin, db.URL, v, election, rounds)
		if err != nil {
			return fmt.Errorf("%s (%s, %s): %w", v.name, v.fault, v.ttlText(), err)
		}
		r.Results = append(r.Results, res)
		noticed := "-"
		if x, ok := res.Extra["noticed_p50_us"]; ok {
			noticed = fmtUs(x)
		}
		tbl.Rows = append(tbl.Rows, []string{v.name, v.fault, v.ttlText(), fmt.Sprintf("%d", res.Ops),
			fmtUs(res.P50us), fmtUs(res.MaxUs), fmtUs(res.Extra["min_us"]), noticed})
	}
	r.Tables = append(r.Tables, tbl)
	overlaps, err := scanInt64(ctx, admin, `SELECT count(*) FROM pgclaim_terms a JOIN pgclaim_terms b
  ON a.election = b.election AND a.term < b.term
WHERE a.ended_at IS NULL OR a.ended_at > b.started_at`)
	if err != nil {
		return err
	}
	r.check("failover: overlapping leadership terms", 0, overlaps)
	return nil
}

func failoverRun(ctx context.Context, e *env, admin *pgxpool.Pool, url string, v foVariant, election string, rounds int) (Result, error) {
	var children []*child
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	wait := 15 * time.Second
	if v.ttl > 0 {
		wait += 3 * v.ttl
	}
	start := func() (*child, error) {
		c, err := startChild(ctx, v, url, election)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
		if _, err := c.wait("ready", wait); err != nil {
			return nil, err
		}
		return c, nil
	}
	class, key := gate.ElectionKey(election)
	if v.mode == "poll" {
		class, key = gate.AdvisoryKey(election)
	}
	// standbyWaiting waits until a standby queues for the lock (advisory)
	// or has had time to try once (lease, poll).
	standbyWaiting := func() error {
		if v.mode != "advisory" {
			time.Sleep(max(v.ttl/4, pollEvery) + 50*time.Millisecond)
			return nil
		}
		deadline := time.Now().Add(wait)
		for time.Now().Before(deadline) {
			n, err := scanInt64(ctx, admin, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
				int64(uint32(class)), int64(uint32(key)))
			if err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			time.Sleep(5 * time.Millisecond)
		}
		return errors.New("standby never queued for the lock")
	}
	leader, err := start()
	if err != nil {
		return Result{}, err
	}
	if _, err := leader.wait("leader", wait); err != nil {
		return Result{}, err
	}
	standby, err := start()
	if err != nil {
		return Result{}, err
	}
	if err := standbyWaiting(); err != nil {
		return Result{}, err
	}
	var times, noticed []time.Duration
	done := 0
	end := e.prog.task(fmt.Sprintf("  failover: %s, %s, TTL %s", v.name, v.fault, v.ttlText()), "rounds", int64(rounds), func() int64 { return int64(done) })
	defer end()
	for range rounds {
		var t0 time.Time
		switch v.fault {
		case "kill":
			t0 = time.Now()
			if err := leader.proc.Kill(); err != nil {
				return Result{}, err
			}
		case "terminate":
			var pid int32
			err := admin.QueryRow(ctx, `SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
				int64(uint32(class)), int64(uint32(key))).Scan(&pid)
			if err != nil {
				return Result{}, fmt.Errorf("find the leader's session: %w", err)
			}
			t0 = time.Now()
			if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return Result{}, err
			}
		}
		// Whoever leads next (the standby, or for a terminated backend
		// possibly the old leader again) ends the round.
		next, ev, lost, err := nextLeader(leader, standby, v.fault == "terminate", wait)
		if err != nil {
			return Result{}, err
		}
		times = append(times, ev.at.Sub(t0))
		if v.fault == "terminate" {
			noticed = append(noticed, lost.at.Sub(t0))
			if next == standby {
				leader, standby = standby, leader
			}
		} else {
			leader.kill()
			leader = standby
			if standby, err = start(); err != nil {
				return Result{}, err
			}
		}
		if err := standbyWaiting(); err != nil {
			return Result{}, err
		}
		time.Sleep(leaderSettle)
		done++
	}
	s := summarize(times)
	mn := slicesMin(times)
	res := Result{Group: v.group, Name: v.name, Ops: int64(len(times)), Unit: "failovers",
		P50us: us(s.P50), P99us: us(s.P99), MaxUs: us(s.Max),
		Extra: map[string]float64{"min_us": us(mn), "ttl_ms": ms(v.ttl)}}
	if v.fault == "terminate" {
		res.Name += " / terminate"
	} else {
		res.Name += " / kill"
	}
	if len(noticed) > 0 {
		res.Extra["noticed_p50_us"] = us(summarize(noticed).P50)
	}
	return res, nil
}

// nextLeader waits, after a fault, for the first "leader" event from either
// child and, when wantLost, for the old leader's "lost" event.
func nextLeader(old, standby *child, wantLost bool, timeout time.Duration) (*child, childEvent, childEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var (
		next           *child
		led, lost      childEvent
		haveLed, haveL = false, !wantLost
	)
	oldEv, sbEv := old.events, standby.events
	for !haveLed || !haveL {
		var ev childEvent
		var ok bool
		var from *child
		select {
		case ev, ok = <-oldEv:
			from = old
			if !ok {
				oldEv = nil
				if wantLost {
					return nil, led, lost, fmt.Errorf("child %d exited", old.proc.Pid())
				}
				continue
			}
		case ev, ok = <-sbEv:
			from = standby
			if !ok {
				return nil, led, lost, fmt.Errorf("child %d exited", standby.proc.Pid())
			}
		case <-t.C:
			return nil, led, lost, fmt.Errorf("no new leader within %s (leader seen: %v, loss seen: %v)", timeout, haveLed, haveL)
		}
		switch ev.kind {
		case "error":
			return nil, led, lost, fmt.Errorf("child %d: %s", from.proc.Pid(), ev.text)
		case "lost":
			if from == old && !haveL {
				lost, haveL = ev, true
			}
		case "leader":
			if !haveLed {
				next, led, haveLed = from, ev, true
			}
		}
	}
	return next, led, lost, nil
}

func slicesMin(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	m := ds[0]
	for _, d := range ds[1:] {
		m = min(m, d)
	}
	return m
}
