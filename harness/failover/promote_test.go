package failover_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestPromotionFencing grants fencing tokens through every grant path on a
// primary, cuts its standby off, grants more (the zombies: each holds a
// token whose WAL the standby never gets), kills the primary and promotes
// the standby, then grants the same rows, tick, lease, election and lock
// again on the new primary and lets the zombies write. No token
// acknowledged before the promotion may be granted again after it, and no
// zombie write may succeed.
//
// Grants are lined up so that a bare sequence would collide: just before
// the standby is cut off the sequence has used up the values its last WAL
// record covers, so the standby, once promoted, resumes exactly where the
// cut-off primary went on, and the n-th grant after the promotion would get
// the token of the n-th zombie.
//
// Synchronous replication: every grant that writes a row waits for the
// standby at commit, so with the standby cut off only a grant whose
// commit does not wait can be acknowledged. A claim (its commit waiting)
// draws the sequence's next batch; an Exclusive run granted after it must
// not be acknowledged before that batch is on the standby either.
func TestPromotionFencing(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		sync bool
	}{{"async", false}, {"sync", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testPromotion(t, mode.sync)
		})
	}
}

// grant is one fencing token handed out, and by what.
type grant struct {
	what  string
	fence int64
}

func (g grant) String() string {
	return fmt.Sprintf("%s %d (timeline %d)", g.what, g.fence, g.fence>>48)
}

var quiet = slog.New(slog.DiscardHandler)

// instance is one service instance's pgclaim objects on its own pool.
type instance struct {
	pool  *pgxpool.Pool
	c     *claim.Claimer[int64]
	g     *gate.Gate
	lease *gate.Lease
	elect *gate.Elector
}

func newInstance(t *testing.T, ctx context.Context, url, holder string) *instance {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	in := &instance{pool: pool}
	in.c, err = claim.New[int64](pool, claim.Table{Name: "jobs", Key: "id", State: "state",
		ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence"},
		claim.Config{From: "PAUSED", To: "PROCESSING", Holder: holder, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if in.g, err = gate.New(pool, gate.Config{Holder: holder, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.g.Close)
	if in.lease, err = gate.NewLease(pool, "lease", gate.LeaseConfig{Holder: holder, Logger: quiet,
		AtMost: time.Minute, NoKeepAlive: true}); err != nil {
		t.Fatal(err)
	}
	if in.elect, err = gate.NewElector(pool, "election", gate.ElectorConfig{Holder: holder, Logger: quiet,
		Mechanism: gate.LeaseRow, TTL: 8 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.elect.Resign(context.Background()) })
	return in
}

// held is a gate run (Once or Exclusive) kept running until released.
type held struct {
	fence   chan int64    // the run's token, once it runs
	release chan struct{} // closed to let the job return
	done    chan error    // what Once or Exclusive returned
	after   func(ctx context.Context, fence int64)
}

func newHeld() *held {
	return &held{fence: make(chan int64, 1), release: make(chan struct{}), done: make(chan error, 1)}
}

// job ignores its context (as a job stuck in a call would) until released,
// then runs after, if set.
func (h *held) job(ctx context.Context, run gate.Run) error {
	h.fence <- run.Fence
	<-h.release
	if h.after != nil {
		h.after(context.WithoutCancel(ctx), run.Fence)
	}
	return nil
}

// started waits for the run to start and returns its token; ok is false
// when the call returned without running the job.
func (h *held) started(t *testing.T, within time.Duration) (fence int64, err error, ok bool) {
	t.Helper()
	select {
	case f := <-h.fence:
		return f, nil, true
	case err := <-h.done:
		return 0, err, false
	case <-time.After(within):
		return 0, errors.New("did not start in time"), false
	}
}

// retry runs op until it returns an error final accepts (nil included) or
// 15 s pass: right after the promotion a pool may still hand out a
// connection to the dead primary.
func retry(ctx context.Context, final func(error) bool, op func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := op()
		if err == nil || final(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func never(error) bool { return false }

// fencedWrite is a receiver that honours fencing tokens: it takes a write
// for name only with a token not lower than the highest it has seen.
func fencedWrite(ctx context.Context, pool *pgxpool.Pool, name, holder string, fence int64) (int64, error) {
	var n int64
	err := retry(ctx, never, func() error {
		tag, err := pool.Exec(ctx, `UPDATE resource SET fence = $2, holder = $3 WHERE name = $1 AND fence <= $2`, name, fence, holder)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}

func exec(t *testing.T, ctx context.Context, url string, stmts ...string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// lineUp uses up the sequence values its last WAL record covers, so that
// the next grant logs a new record.
func lineUp(t *testing.T, ctx context.Context, url string) (last int64) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var left int64
		if err := conn.QueryRow(ctx, "SELECT last_value, log_cnt FROM pgclaim_fence_seq").Scan(&last, &left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return last
		}
		if _, err := conn.Exec(ctx, "SELECT nextval('pgclaim_fence_seq') FROM generate_series(1, $1)", left); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSyncRep waits until a session on the primary waits for the
// synchronous standby.
func waitSyncRep(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no commit waits for the synchronous standby")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testPromotion(t *testing.T, syncRep bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pair := pgtest.NewPair(t, pgtest.PairConfig{Synchronous: syncRep})

	exec(t, ctx, pair.PrimaryURL("postgres"), "CREATE DATABASE app")
	setup, err := pgxpool.New(ctx, pair.PrimaryURL("app"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, setup); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	exec(t, ctx, pair.PrimaryURL("app"),
		`CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL, claimed_at timestamptz, claimed_by text, fence bigint)`,
		`INSERT INTO jobs (id, state) SELECT g, 'PAUSED' FROM generate_series(1, 10) AS g`,
		`CREATE TABLE resource (name text PRIMARY KEY, fence bigint NOT NULL, holder text NOT NULL)`,
		`INSERT INTO resource VALUES ('exclusive', 0, '')`)

	var (
		mu    sync.Mutex
		acked []grant // acknowledged before the promotion
		fresh []grant // granted after it
	)
	ack := func(list *[]grant, what string, fence int64) {
		mu.Lock()
		*list = append(*list, grant{what, fence})
		mu.Unlock()
	}

	// Before the cut: one grant of every kind, replicated.
	old := newInstance(t, ctx, pair.URL("app"), "old")
	cl, err := old.c.ClaimBatch(ctx, 1)
	if err != nil || len(cl) != 1 {
		t.Fatalf("claim before the cut: %v %v", cl, err)
	}
	ack(&acked, "claim", cl[0].Fence)
	if err := old.c.Finish(ctx, cl[0], "DONE"); err != nil {
		t.Fatal(err)
	}
	if err := old.g.Once(ctx, "tick-a", time.Now(), func(_ context.Context, run gate.Run) error {
		ack(&acked, "tick", run.Fence)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := old.g.Exclusive(ctx, "exclusive-a", func(_ context.Context, run gate.Run) error {
		ack(&acked, "exclusive", run.Fence)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	lh, err := old.lease.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ack(&acked, "lease", lh.Fence())
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := old.elect.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	ack(&acked, "term", old.elect.Fence())
	if err := old.elect.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	last := lineUp(t, ctx, pair.PrimaryURL("app"))
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	pair.StopStandby()
	t.Logf("standby cut off with pgclaim_fence_seq at %d", last)

	// The zombies: grants the standby never receives.
	var zombieClaim *claim.Claim[int64]
	zombieTick, zombieEx := newHeld(), newHeld()
	var zombieLease *gate.LeaseHandle
	zombieLeads := false
	fireAt := time.Now().UTC().Truncate(time.Second)
	exStale := make(chan string, 1) // what the zombie's write after the promotion did
	waiting := make(chan error, 1)  // sync: the claim whose commit waits
	zombieEx.after = func(ctx context.Context, fence int64) {
		n, err := fencedWrite(ctx, old.pool, "exclusive", "zombie", fence)
		exStale <- fmt.Sprintf("rows %d, err %v", n, err)
	}
	if !syncRep {
		cl, err := old.c.ClaimBatch(ctx, 1)
		if err != nil || len(cl) != 1 {
			t.Fatalf("zombie claim: %v %v", cl, err)
		}
		zombieClaim = &cl[0]
		ack(&acked, "claim", cl[0].Fence)

		go func() { zombieTick.done <- old.g.Once(ctx, "tick-b", fireAt, zombieTick.job) }()
		f, err, ok := zombieTick.started(t, 10*time.Second)
		if !ok {
			t.Fatalf("zombie tick: %v", err)
		}
		ack(&acked, "tick", f)

		if zombieLease, err = old.lease.TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
		ack(&acked, "lease", zombieLease.Fence())

		if _, err := old.elect.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		zombieLeads = true
		ack(&acked, "term", old.elect.Fence())
	} else {
		// A claim whose commit waits for the cut-off standby: not
		// acknowledged, but it draws the sequence's next batch.
		go func() {
			cl, err := old.c.ClaimBatch(ctx, 1)
			waiting <- fmt.Errorf("claimed %v: %w", cl, err)
		}()
		waitSyncRep(t, ctx, pair.PrimaryURL("app"))
	}
	exCtx, exCancel := context.WithTimeout(ctx, 3*time.Second)
	defer exCancel()
	go func() { zombieEx.done <- old.g.Exclusive(exCtx, "exclusive", zombieEx.job) }()
	zombieExFence, err, zombieExOK := zombieEx.started(t, 10*time.Second)
	if zombieExOK {
		ack(&acked, "exclusive", zombieExFence)
	} else {
		t.Logf("zombie Exclusive not granted: %v", err)
		if !syncRep {
			t.Errorf("zombie Exclusive with asynchronous replication: %v", err)
		}
	}

	pair.KillPrimary()
	if syncRep {
		select {
		case err := <-waiting:
			t.Logf("the claim waiting for the standby ended with the primary: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("the claim waiting for the standby did not end with the primary")
		}
	}
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	// The new primary's grants, in the zombies' order.
	nu := newInstance(t, ctx, pair.URL("app"), "new")
	var nuClaim claim.Claim[int64]
	if err := retry(ctx, never, func() error {
		cl, err := nu.c.ClaimBatch(ctx, 1)
		if err == nil && len(cl) != 1 {
			return fmt.Errorf("claimed %d rows", len(cl))
		}
		if err == nil {
			nuClaim = cl[0]
		}
		return err
	}); err != nil {
		t.Fatalf("claim on the new primary: %v", err)
	}
	ack(&fresh, "claim", nuClaim.Fence)

	nuTick, nuEx := newHeld(), newHeld()
	var nuLease *gate.LeaseHandle
	if !syncRep {
		go func() { nuTick.done <- nu.g.Once(ctx, "tick-b", fireAt, nuTick.job) }()
		f, err, ok := nuTick.started(t, 10*time.Second)
		if !ok {
			t.Fatalf("tick on the new primary: %v", err)
		}
		ack(&fresh, "tick", f)

		if nuLease, err = nu.lease.TryAcquire(ctx); err != nil {
			t.Fatalf("lease on the new primary: %v", err)
		}
		ack(&fresh, "lease", nuLease.Fence())

		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		_, err = nu.elect.Campaign(cctx)
		ccancel()
		if err != nil {
			t.Fatalf("campaign on the new primary: %v", err)
		}
		ack(&fresh, "term", nu.elect.Fence())
	}
	go func() { nuEx.done <- nu.g.Exclusive(ctx, "exclusive", nuEx.job) }()
	nuExFence, err, ok := nuEx.started(t, 10*time.Second)
	if !ok {
		t.Fatalf("Exclusive on the new primary: %v", err)
	}
	ack(&fresh, "exclusive", nuExFence)
	if n, err := fencedWrite(ctx, nu.pool, "exclusive", "new", nuExFence); n != 1 || err != nil {
		t.Errorf("the new Exclusive holder's fenced write: rows %d, err %v", n, err)
	}

	// No acknowledged token is granted again.
	mu.Lock()
	top := slices.MaxFunc(acked, func(a, b grant) int { return cmp.Compare(a.fence, b.fence) })
	var reissued []string
	for _, g := range fresh {
		if g.fence <= top.fence {
			reissued = append(reissued, g.String())
		}
	}
	if len(reissued) > 0 {
		t.Errorf("granted after the promotion at or below %s acknowledged before it: %s", top, strings.Join(reissued, ", "))
	}
	t.Logf("acknowledged before the promotion: %v; granted after: %v", acked, fresh)
	mu.Unlock()

	// The zombies write on the new primary: none may succeed.
	if zombieClaim != nil {
		err := retry(ctx, func(err error) bool { return errors.Is(err, claim.ErrLost) }, func() error {
			return old.c.Finish(ctx, *zombieClaim, "DONE")
		})
		if !errors.Is(err, claim.ErrLost) {
			t.Errorf("zombie Finish of row %d with fence %d on the new primary: %v, want ErrLost", zombieClaim.Key, zombieClaim.Fence, err)
		}
		if err := retry(ctx, func(err error) bool { return errors.Is(err, claim.ErrLost) }, func() error {
			return nu.c.Finish(ctx, nuClaim, "DONE")
		}); err != nil {
			t.Errorf("the new claimant's Finish of row %d with fence %d: %v", nuClaim.Key, nuClaim.Fence, err)
		}
	}
	if zombieLease != nil {
		err := retry(ctx, func(err error) bool { return errors.Is(err, gate.ErrLockLost) }, func() error {
			return zombieLease.Extend(ctx)
		})
		if !errors.Is(err, gate.ErrLockLost) {
			t.Errorf("zombie lease (fence %d) extended on the new primary: %v, want ErrLockLost", zombieLease.Fence(), err)
		}
		if err := nuLease.Release(ctx); err != nil {
			t.Errorf("the new lease holder's Release (fence %d): %v", nuLease.Fence(), err)
		}
	}
	if !syncRep {
		// The zombie's outcome (lost: its session died) is written through
		// the pool, to the new primary.
		close(zombieTick.release)
		if err := <-zombieTick.done; !errors.Is(err, gate.ErrLockLost) {
			t.Errorf("zombie tick run: %v, want ErrLockLost", err)
		}
		close(nuTick.release)
		if err := <-nuTick.done; err != nil {
			t.Errorf("the new tick run: %v", err)
		}
		var outcome string
		var fence int64
		if err := nu.pool.QueryRow(ctx, "SELECT outcome, fence FROM pgclaim_ticks WHERE job = 'tick-b' AND fire_at = $1",
			pgtype.Timestamptz{Time: fireAt, Valid: true}).Scan(&outcome, &fence); err != nil {
			t.Fatal(err)
		}
		if outcome != "succeeded" || fence != fresh[1].fence {
			t.Errorf("tick-b on the new primary: outcome %s, fence %d; want succeeded, fence %d (the new run's)", outcome, fence, fresh[1].fence)
		}
	}
	if zombieLeads {
		// Its renewals reach the new primary every TTL/4.
		deadline := time.Now().Add(8 * time.Second)
		for old.elect.IsLeader() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if old.elect.IsLeader() {
			t.Errorf("the zombie elector still leads (term %d) beside the new leader (term %d, leading %v)",
				old.elect.Fence(), nu.elect.Fence(), nu.elect.IsLeader())
		}
	}
	if zombieExOK {
		close(zombieEx.release)
		if got := <-exStale; got != "rows 0, err <nil>" {
			t.Errorf("zombie Exclusive's fenced write (fence %d) after the new holder's (fence %d): %s, want rows 0", zombieExFence, nuExFence, got)
		}
		<-zombieEx.done
	}
	close(nuEx.release)
	if err := <-nuEx.done; err != nil {
		t.Errorf("the new Exclusive run: %v", err)
	}
}
