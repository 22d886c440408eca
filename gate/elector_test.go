package gate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/pgtest"
)

// electorVariants runs f for both elector variants.
func electorVariants(t *testing.T, f func(t *testing.T, lease bool)) {
	for _, lease := range []bool{false, true} {
		name := "advisory"
		if lease {
			name = "lease"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, lease)
		})
	}
}

// mechanism returns LeaseRow for the lease variant of a test that runs
// both, Advisory otherwise.
func mechanism(lease bool) gate.Mechanism {
	if lease {
		return gate.LeaseRow
	}
	return gate.Advisory
}

func newElector(t testing.TB, pool *pgxpool.Pool, name, holder string, o gate.ElectorConfig) *gate.Elector {
	t.Helper()
	o.Holder = holder
	e, err := gate.NewElector(pool, name, o)
	if err != nil {
		t.Fatalf("NewElector: %v", err)
	}
	return e
}

// termRow is one row of pgclaim_terms.
type termRow struct {
	Term       int64
	Holder     string
	StartedAt  time.Time
	EndedAt    *time.Time
	EndReason  *string
	LeaseUntil *time.Time
}

func (r termRow) String() string {
	f := func(p *time.Time) string {
		if p == nil {
			return "-"
		}
		return p.Format("15:04:05.000000")
	}
	reason := "-"
	if r.EndReason != nil {
		reason = *r.EndReason
	}
	return fmt.Sprintf("term %d (%s, %s..%s %s, lease until %s)", r.Term, r.Holder,
		r.StartedAt.Format("15:04:05.000000"), f(r.EndedAt), reason, f(r.LeaseUntil))
}

// checkTerms verifies the recorded terms of election: at most one open, and
// every term ended at or before the next one started (database time), with
// term numbers rising in start order. It returns the terms.
func checkTerms(t testing.TB, pool *pgxpool.Pool, election string) []termRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT term, holder, started_at, ended_at, end_reason, lease_until
		FROM pgclaim_terms WHERE election = $1 ORDER BY started_at, term`, election)
	if err != nil {
		t.Fatal(err)
	}
	terms, err := pgx.CollectRows(rows, pgx.RowToStructByPos[termRow])
	if err != nil {
		t.Fatal(err)
	}
	open := 0
	for i, tr := range terms {
		if tr.EndedAt == nil {
			open++
			if i != len(terms)-1 {
				t.Errorf("term %d (%s) is open but not the latest", tr.Term, tr.Holder)
			}
			continue
		}
		if i+1 < len(terms) {
			next := terms[i+1]
			if tr.EndedAt.After(next.StartedAt) {
				t.Errorf("terms overlap: %s ended after %s started", tr, next)
			}
			if next.Term <= tr.Term {
				t.Errorf("term %d started after term %d", next.Term, tr.Term)
			}
		}
	}
	if open > 1 {
		t.Errorf("%d open terms", open)
	}
	return terms
}

// electionHolderPID is the backend holding the election's advisory lock.
func electionHolderPID(ctx context.Context, pool *pgxpool.Pool, name string) (uint32, error) {
	return pgprobe.AdvisoryHolder(ctx, pool, pgprobe.Pair(gate.ElectionKey(name)))
}

func TestElectorOneLeaderAndResign(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second, RetryInterval: 20 * time.Millisecond}
		ctx := context.Background()
		es := make([]*gate.Elector, 3)
		won := make(chan int, len(es))
		for i := range es {
			es[i] = newElector(t, db.NewPool(t), "scheduler", fmt.Sprintf("inst-%d", i), o)
			go func() {
				if _, err := es[i].Campaign(ctx); err == nil {
					won <- i
				}
			}()
		}
		first := <-won
		select {
		case i := <-won:
			t.Fatalf("two leaders: %d and %d", first, i)
		case <-time.After(300 * time.Millisecond):
		}
		for i, e := range es {
			if e.IsLeader() != (i == first) {
				t.Fatalf("IsLeader of %d = %v", i, e.IsLeader())
			}
		}
		if es[first].Fence() <= 0 {
			t.Fatalf("leader's Fence() = %d", es[first].Fence())
		}
		lctx, err := es[first].Campaign(ctx) // already leader: at once
		if err != nil {
			t.Fatal(err)
		}
		if err := es[first].Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if lctx.Err() == nil || es[first].IsLeader() || es[first].Fence() != 0 {
			t.Fatal("resigned leader still leads")
		}
		start := time.Now()
		second := <-won
		t.Logf("handover after Resign: %v", time.Since(start))
		if second == first {
			t.Fatal("resigned instance won again without campaigning")
		}
		if err := es[second].Resign(ctx); err != nil {
			t.Fatal(err)
		}
		third := <-won
		if err := es[third].Resign(ctx); err != nil {
			t.Fatal(err)
		}
		terms := checkTerms(t, db.Pool, "scheduler")
		if len(terms) != 3 {
			t.Fatalf("%d terms recorded; want 3", len(terms))
		}
		for _, tr := range terms {
			if tr.EndReason == nil || *tr.EndReason != "resigned" {
				t.Errorf("term %d: reason %v; want resigned", tr.Term, tr.EndReason)
			}
			if (tr.LeaseUntil != nil) != lease {
				t.Errorf("term %d: lease_until %v for lease=%v", tr.Term, tr.LeaseUntil, lease)
			}
		}
	})
}

// The leader's backend is terminated: the leader's context is cancelled at
// once and a standby leads within milliseconds, because the live old leader
// closes its term as soon as it sees its session end.
func TestElectorAdvisoryLeaderConnectionKilled(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	srv := pgtest.Shared(t)
	ctx := context.Background()
	o := gate.ElectorConfig{TTL: 2 * time.Second}
	leader := newElector(t, db.NewPool(t), "scheduler", "leader", o)
	standby := newElector(t, db.NewPool(t), "scheduler", "standby", o)
	lctx, err := leader.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan time.Time, 1)
	go func() {
		if _, err := standby.Campaign(ctx); err == nil {
			won <- time.Now()
		}
	}()
	time.Sleep(100 * time.Millisecond) // the standby is blocked in pg_advisory_lock
	if standby.IsLeader() {
		t.Fatal("standby leads while the leader lives")
	}
	pid, err := electionHolderPID(ctx, db.Pool, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	steppedDown := make(chan time.Time, 1)
	context.AfterFunc(lctx, func() { steppedDown <- time.Now() })
	killed := time.Now()
	if err := srv.Terminate(ctx, pid); err != nil { // returns once the backend has exited
		t.Fatal(err)
	}
	var lost time.Duration
	select {
	case at := <-steppedDown:
		lost = at.Sub(killed)
	case <-time.After(time.Second):
		t.Fatal("leader's context not cancelled within 1s of its backend being terminated")
	}
	if !errors.Is(context.Cause(lctx), gate.ErrLockLost) {
		t.Fatalf("cause = %v; want ErrLockLost", context.Cause(lctx))
	}
	var at time.Time
	select {
	case at = <-won:
	case <-time.After(o.TTL + time.Second):
		t.Fatalf("standby did not lead within TTL (%v)", o.TTL)
	}
	t.Logf("backend terminated: old leader stepped down after %v, standby led after %v (TTL %v)", lost, at.Sub(killed), o.TTL)
	if at.Sub(killed) < lost {
		t.Fatalf("standby led %v after the kill, before the old leader stepped down (%v)", at.Sub(killed), lost)
	}
	if leader.IsLeader() {
		t.Fatal("old leader still reports leadership")
	}
	terms := checkTerms(t, db.Pool, "scheduler")
	if len(terms) != 2 || *terms[0].EndReason != "lost" || terms[1].Holder != "standby" {
		t.Fatalf("terms = %+v", terms)
	}
	standby.Resign(ctx)
}

// A leader that crashes (no hand-over) is replaced once TTL has passed: the
// standby gets the lock at once but waits TTL for the old term to close.
func TestElectorCrashedLeaderReplacedAfterTTL(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		ctx := context.Background()
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: 400 * time.Millisecond, RetryInterval: 20 * time.Millisecond}
		leader := newElector(t, db.NewPool(t), "scheduler", "leader", o)
		standby := newElector(t, db.NewPool(t), "scheduler", "standby", o)
		lctx, err := leader.Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		won := make(chan time.Time, 1)
		go func() {
			if _, err := standby.Campaign(ctx); err == nil {
				won <- time.Now()
			}
		}()
		time.Sleep(50 * time.Millisecond)
		crashed := time.Now()
		if !leader.Crash() {
			t.Fatal("no term to crash")
		}
		if lctx.Err() == nil {
			t.Fatal("crashed leader's context not cancelled")
		}
		var at time.Time
		select {
		case at = <-won:
		case <-time.After(o.TTL + 2*time.Second):
			t.Fatalf("standby did not lead within TTL (%v) + 2s", o.TTL)
		}
		took := at.Sub(crashed)
		t.Logf("leader crashed: standby led after %v (TTL %v)", took, o.TTL)
		if took < o.TTL/2 {
			t.Fatalf("standby led after %v, before the crashed leader's term could be considered over (TTL %v)", took, o.TTL)
		}
		terms := checkTerms(t, db.Pool, "scheduler")
		want := "superseded"
		if lease {
			want = "expired"
		}
		if len(terms) != 2 || terms[0].EndReason == nil || *terms[0].EndReason != want {
			t.Fatalf("terms = %+v; want the crashed term %s", terms, want)
		}
		standby.Resign(ctx)
	})
}

// In the lease variant a leader's connection can drop without consequence:
// the lease is renewed on the next connection.
func TestElectorLeaseSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	srv := pgtest.Shared(t)
	ctx := context.Background()
	o := gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: time.Second}
	pool := db.NewPool(t)
	e := newElector(t, pool, "scheduler", "leader", o)
	lctx, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := srv.TerminateDatabase(ctx, db.Name); err != nil {
			t.Fatal(err)
		}
		time.Sleep(o.TTL / 2)
	}
	if lctx.Err() != nil || !e.IsLeader() {
		t.Fatalf("leadership lost with the connections: %v", context.Cause(lctx))
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	terms := checkTerms(t, db.Pool, "scheduler")
	if len(terms) != 1 || *terms[0].EndReason != "resigned" {
		t.Fatalf("terms = %+v", terms)
	}
}

// 60 leadership changes among 3 instances running Run: leaders resign or are
// killed (backend terminated, or a simulated crash), and a shared counter of
// running leader functions never exceeds one; the terms table shows no
// overlap.
func TestElectorFlip60(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		srv := pgtest.Shared(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ttl := 300 * time.Millisecond
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: ttl, RetryInterval: 10 * time.Millisecond}

		const n = 3
		var (
			active     atomic.Int32
			violations atomic.Int32
			entered    = make(chan leaderEntry, 128)
		)
		es := make([]*gate.Elector, n)
		var wg sync.WaitGroup
		for i := range es {
			es[i] = newElector(t, db.NewPool(t), "flip", fmt.Sprintf("inst-%d", i), o)
			wg.Go(func() {
				err := es[i].Run(ctx, func(lctx context.Context, run gate.Run) error {
					if active.Add(1) != 1 {
						violations.Add(1)
					}
					entered <- leaderEntry{i, time.Now()}
					<-lctx.Done()
					active.Add(-1)
					return nil
				})
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run %d: %v", i, err)
				}
			})
		}

		const flips = 60
		var resignT, killT []time.Duration
		again := 0
		for k := 0; k <= flips; k++ {
			var who leaderEntry
			select {
			case who = <-entered:
			case <-time.After(ttl + 5*time.Second):
				t.Fatalf("flip %d: no leader within TTL+5s", k)
			}
			if k == flips {
				break
			}
			prev := who
			t0 := time.Now()
			if k%2 == 0 {
				if err := es[who.i].Resign(ctx); err != nil {
					t.Fatalf("flip %d: Resign: %v", k, err)
				}
			} else if lease {
				es[who.i].Crash()
			} else {
				pid, err := electionHolderPID(ctx, db.Pool, "flip")
				if err != nil {
					t.Fatalf("flip %d: holder pid: %v", k, err)
				}
				// The session may end on its own between the read and the
				// terminate (on a starved machine, not confirmed within its
				// TTL): the flip happens without it.
				if err := srv.Terminate(ctx, pid); err != nil && !strings.Contains(err.Error(), "no such backend") {
					t.Fatalf("flip %d: terminate: %v", k, err)
				}
			}
			// measured up to the next leader's leaderEntry, below
			select {
			case who = <-entered:
			case <-time.After(ttl + 5*time.Second):
				t.Fatalf("flip %d: no new leader within TTL+5s", k)
			}
			d := who.at.Sub(t0)
			if who.i == prev.i {
				again++
			}
			if k%2 == 0 {
				resignT = append(resignT, d)
			} else {
				killT = append(killT, d)
			}
			entered <- who // hand the leaderEntry to the next iteration
		}
		cancel()
		wg.Wait()
		if v := violations.Load(); v != 0 {
			t.Fatalf("%d times two leader functions ran at once", v)
		}
		terms := checkTerms(t, db.Pool, "flip")
		if len(terms) < flips+1 {
			t.Fatalf("%d terms recorded; want at least %d", len(terms), flips+1)
		}
		for _, tr := range terms {
			if tr.EndedAt == nil {
				t.Errorf("term %d still open after every Run returned", tr.Term)
			}
		}
		kill := "backend terminated"
		if lease {
			kill = "crash"
		}
		t.Logf("%d terms, %d times the same instance led again; takeover after resign: %s; after %s: %s (TTL %v)", len(terms), again, durStats(resignT), kill, durStats(killT), ttl)
	})
}

// leaderEntry is a leader function starting: which instance, when.
type leaderEntry struct {
	i  int
	at time.Time
}

// durStats renders min / median / max.
func durStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	return fmt.Sprintf("min %s, median %s, max %s (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

func TestElectorCampaignCancelled(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second}
		leader := newElector(t, db.NewPool(t), "e", "leader", o)
		standby := newElector(t, db.NewPool(t), "e", "standby", o)
		if _, err := leader.Campaign(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := standby.Campaign(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Campaign = %v; want DeadlineExceeded", err)
		}
		if !lease {
			// The cancelled wait left no waiter behind in the lock queue.
			class, key := gate.ElectionKey("e")
			var waiting int
			deadline := time.Now().Add(2 * time.Second)
			for {
				n, err := pgprobe.CountAdvisory(context.Background(), db.Pool, pgprobe.Waiting, pgprobe.Pair(class, key))
				if err != nil {
					t.Fatal(err)
				}
				waiting = n
				if waiting == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if waiting != 0 {
				t.Fatalf("%d waiters left in the lock queue", waiting)
			}
		}
		if err := leader.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := standby.Campaign(context.Background()); err != nil {
			t.Fatal(err)
		}
		standby.Resign(context.Background())
	})
}

func TestElectorRunReturnsFnError(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		var kinds []string
		var mu sync.Mutex
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second, Hooks: gate.HooksFunc(func(_ context.Context, e gate.Event) {
			mu.Lock()
			kinds = append(kinds, e.Kind.String())
			mu.Unlock()
		})}
		e := newElector(t, db.Pool, "e", "a", o)
		boom := errors.New("boom")
		var fence int64
		err := e.Run(context.Background(), func(ctx context.Context, run gate.Run) error {
			fence = run.Fence
			if !e.IsLeader() || run.Name != "e" || run.Holder != "a" || run.Fence <= 0 {
				return fmt.Errorf("run = %+v, leader %v", run, e.IsLeader())
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Run = %v; want the function's error", err)
		}
		if e.IsLeader() {
			t.Fatal("still leader after Run returned")
		}
		terms := checkTerms(t, db.Pool, "e")
		if len(terms) != 1 || terms[0].Term != fence || terms[0].EndedAt == nil {
			t.Fatalf("terms = %+v; want one closed term %d", terms, fence)
		}
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(kinds, " "); got != "acquired released" {
			t.Fatalf("events = %q", got)
		}
	})
}

func TestElectorBadInput(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, c := range []struct {
		name  string
		pool  *pgxpool.Pool
		elect string
		o     gate.ElectorConfig
		field string
	}{
		{"nil pool", nil, "x", gate.ElectorConfig{}, "pool"},
		{"empty name", pool, "", gate.ElectorConfig{}, "name"},
		{"negative TTL", pool, "x", gate.ElectorConfig{TTL: -time.Second}, "ElectorConfig.TTL"},
		{"tiny TTL", pool, "x", gate.ElectorConfig{TTL: time.Millisecond}, "ElectorConfig.TTL"},
		{"negative RetryInterval", pool, "x", gate.ElectorConfig{RetryInterval: -1}, "ElectorConfig.RetryInterval"},
	} {
		e, err := gate.NewElector(c.pool, c.elect, c.o)
		if e != nil || !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%s: NewElector = %v, %v; want ErrInvalid naming %s", c.name, e, err, c.field)
		}
	}
	// NewElector checks the schema, so the rest needs a real database.
	e, err := gate.NewElector(pgtest.Pool(t), "x", gate.ElectorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(context.Background(), nil); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "fn:") {
		t.Errorf("Run(nil) = %v; want ErrInvalid naming fn", err)
	}
}

func TestElectionKeyDiffersFromAdvisoryKey(t *testing.T) {
	c1, k1 := gate.AdvisoryKey("x")
	c2, k2 := gate.ElectionKey("x")
	if c1 == c2 || k1 != k2 || c2 != gate.ElectionClass {
		t.Fatalf("AdvisoryKey = (%d,%d), ElectionKey = (%d,%d)", c1, k1, c2, k2)
	}
}

// TestElectorServerRestart restarts the shared server under a leader and a
// standby. It runs alone (no t.Parallel), since a restart cuts every session
// of the test process. Advisory: the leader loses leadership at once and one
// instance leads again soon after the server is back. Lease: the leader
// keeps leadership through a restart shorter than its lease.
func TestElectorServerRestart(t *testing.T) {
	srv := pgtest.Shared(t)
	for _, lease := range []bool{false, true} {
		name := "advisory"
		if lease {
			name = "lease"
		}
		t.Run(name, func(t *testing.T) {
			db := pgtest.NewDatabase(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: 4 * time.Second, RetryInterval: 50 * time.Millisecond}
			es := []*gate.Elector{
				newElector(t, db.NewPool(t), "e", "a", o),
				newElector(t, db.NewPool(t), "e", "b", o),
			}
			type led struct {
				i  int
				at time.Time
			}
			leads := make(chan led, 16)
			stepped := make(chan time.Time, 16)
			var wg sync.WaitGroup
			for i, e := range es {
				wg.Go(func() {
					e.Run(ctx, func(lctx context.Context, run gate.Run) error {
						leads <- led{i, time.Now()}
						<-lctx.Done()
						stepped <- time.Now()
						return nil
					})
				})
			}
			first := <-leads
			time.Sleep(100 * time.Millisecond) // the standby waits
			t0 := time.Now()
			if err := srv.Restart(ctx); errors.Is(err, pgtest.ErrUnsupported) {
				cancel()
				wg.Wait()
				t.Skipf("server cannot be restarted: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			back := time.Since(t0)
			if lease {
				time.Sleep(o.TTL / 2) // renewals go on over fresh connections
				if !es[first.i].IsLeader() {
					t.Fatal("lease leader lost leadership over a short restart")
				}
				select {
				case l := <-leads:
					t.Fatalf("instance %d led during the restart", l.i)
				default:
				}
				t.Logf("restart took %v; lease leader kept leadership", back)
			} else {
				select {
				case at := <-stepped:
					t.Logf("restart took %v; leader stepped down %v after it began", back, at.Sub(t0))
				case <-time.After(time.Second):
					t.Fatal("leader did not step down within 1s of the restart")
				}
				select {
				case l := <-leads:
					t.Logf("instance %d leads %v after the restart began (%v after the server was back)", l.i, l.at.Sub(t0), l.at.Sub(t0)-back)
					if l.at.Sub(t0)-back > o.TTL/2 {
						t.Errorf("took over only after %v: the old term was not closed by its leader", l.at.Sub(t0)-back)
					}
				case <-time.After(o.TTL + 5*time.Second):
					t.Fatal("no leader after the restart")
				}
			}
			cancel()
			wg.Wait()
			checkTerms(t, db.Pool, "e")
		})
	}
}

// Behind a connection pooler (a proxy announcing another backend pid, as
// PgBouncer does) the advisory elector refuses with ErrPooler; the lease
// elector and the lease lock work.
func TestElectorBehindPooler(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	cfg := pgprobe.ProxyConfig(t, db.Pool, true, nil)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()

	adv := newElector(t, pool, "e", "a", gate.ElectorConfig{TTL: time.Second})
	if _, err := adv.Campaign(ctx); !errors.Is(err, gate.ErrPooler) {
		t.Fatalf("advisory Campaign behind a pooler = %v; want ErrPooler", err)
	}
	le := newElector(t, pool, "e", "a", gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: time.Second})
	if _, err := le.Campaign(ctx); err != nil {
		t.Fatalf("lease Campaign behind a pooler: %v", err)
	}
	if err := le.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	l := newLease(t, pool, "job", "a", gate.LeaseConfig{AtMost: time.Second})
	if err := l.Do(ctx, func(context.Context, gate.Run) error { return nil }); err != nil {
		t.Fatalf("lease lock behind a pooler: %v", err)
	}
}

// TestElectorPrune: Prune deletes the election's terms that ended before
// the limit, and keeps recent ones, the open term (leadership goes on) and
// other elections' terms.
func TestElectorPrune(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second, RetryInterval: 20 * time.Millisecond}
		ctx := context.Background()
		e := newElector(t, db.Pool, "scheduler", "a", o)
		other := newElector(t, db.Pool, "other", "a", o)
		for _, el := range []*gate.Elector{e, e, e, other} {
			if _, err := el.Campaign(ctx); err != nil {
				t.Fatal(err)
			}
			if err := el.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.Resign(ctx) }()
		// The first two terms of "scheduler" and the one of "other" ended
		// two hours ago.
		if _, err := db.Pool.Exec(ctx, `
			UPDATE pgclaim_terms SET started_at = started_at - interval '2 hours', ended_at = ended_at - interval '2 hours'
			WHERE (election = 'scheduler' AND term IN (SELECT term FROM pgclaim_terms WHERE election = 'scheduler' ORDER BY term LIMIT 2))
			   OR election = 'other'`); err != nil {
			t.Fatal(err)
		}

		n, err := e.Prune(ctx, time.Hour)
		if err != nil || n != 2 {
			t.Fatalf("Prune = %d, %v; want 2 terms deleted", n, err)
		}
		terms := checkTerms(t, db.Pool, "scheduler")
		if len(terms) != 2 || terms[0].EndedAt == nil || terms[1].EndedAt != nil || terms[1].Term != e.Fence() {
			t.Errorf("terms left %v; want the recent ended one and the open one", terms)
		}
		if left := checkTerms(t, db.Pool, "other"); len(left) != 1 {
			t.Errorf("other election's terms %v; want its one term kept", left)
		}
		if !e.IsLeader() {
			t.Error("Prune ended the leadership")
		}
		if n, err := e.Prune(ctx, time.Hour); err != nil || n != 0 {
			t.Errorf("second Prune = %d, %v; want 0", n, err)
		}
		if _, err := e.Prune(ctx, 0); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "olderThan") {
			t.Errorf("Prune(0) = %v; want ErrInvalid naming olderThan", err)
		}
	})
}
