package claim

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/child"
)

// recoverChildEnv names the database a re-run test binary works on as the
// instance TestRecoverAfterKill kills.
const recoverChildEnv = "PGCLAIM_CLAIM_RECOVER_CHILD"

const (
	recoverLease = 2 * time.Second
	recoverEvery = 500 * time.Millisecond
)

// recoverWorker is the push worker of TestRecoverAfterKill as both of its
// instances run it: leased claims, Recover sweeping every recoverEvery, and
// a provider call (an insert through the pool, outside the claim's
// transaction: it stays when the holder dies) with the row's key as its
// idempotency key before the claim's own effect.
func recoverWorker(t testing.TB, pool *pgxpool.Pool, holder string) *Worker[int64] {
	t.Helper()
	tbl := jobsTable
	c, err := New[int64](pool, tbl, Config{From: "PAUSED", To: "PROCESSING", Holder: holder, Lease: recoverLease, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := NewSweeper(c, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 100, Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 5}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 10, Concurrency: 4,
		Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 5}, Recover: sw, RecoverEvery: recoverEvery,
		Work: func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
			if _, err := pool.Exec(ctx, `INSERT INTO provider_calls (key, holder, fence) VALUES ($1, $2, $3)`, cl.Key, holder, cl.Fence); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			_, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) VALUES ($1, $2, $3)`, cl.Key, holder, cl.Fence)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestRecoverChild is the instance TestRecoverAfterKill starts and kills.
func TestRecoverChild(t *testing.T) {
	url := os.Getenv(recoverChildEnv)
	if url == "" {
		t.Skip("run by TestRecoverAfterKill")
	}
	// Each of the 4 works holds a connection for its transaction and takes
	// another for the provider call; claims and heartbeats take two more.
	pool, err := pgxpool.New(context.Background(), url+sep(url)+"pool_max_conns=10")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = recoverWorker(t, pool, "child").Run(context.Background()) // until killed
}

// TestRecoverAfterKill: an instance working through a backlog is killed
// with SIGKILL mid-batch; another, draining with Recover, returns only once
// every row is finished: the killed holder's rows come back when their
// leases run out and are worked once more. Every row has one effect, every
// row was passed to the provider under its own key, and the rows passed
// twice are those the killed instance held.
func TestRecoverAfterKill(t *testing.T) {
	t.Parallel()
	const rows = 200
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", rows)
	mustExec(t, db.Pool, `CREATE TABLE provider_calls (key bigint NOT NULL, holder text NOT NULL, fence bigint NOT NULL)`)
	ctx := testCtx(t)

	p, err := child.Start(child.Config{Args: []string{"-test.run=^TestRecoverChild$", "-test.count=1"}, Env: []string{recoverChildEnv + "=" + db.URL}, StderrTo: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Kill(); <-p.Done() }()
	deadline := time.Now().Add(30 * time.Second)
	for count(t, db.Pool, `SELECT count(*) FROM effects WHERE holder = 'child'`) < 20 {
		if time.Now().After(deadline) {
			t.Fatal("the child did not work 20 rows within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	killed := time.Now()
	held := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state = 'PROCESSING' AND claimed_by = 'child'`)

	pool, err := pgxpool.New(ctx, db.URL+sep(db.URL)+"pool_max_conns=10")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := recoverWorker(t, pool, "survivor").Drain(ctx)
	took := time.Since(killed)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed with %d rows held; Drain returned %v later (lease %v, recovery every %v): %+v", held, took, recoverLease, recoverEvery, st)
	exactlyOnceEffects(t, db.Pool, rows)
	if n := count(t, db.Pool, `SELECT count(*) FROM jobs WHERE state <> 'DONE'`); n != 0 {
		t.Errorf("%d rows not DONE after Drain", n)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT key) FROM provider_calls`); n != rows {
		t.Errorf("%d keys passed to the provider, want %d", n, rows)
	}
	twice := count(t, db.Pool, `SELECT count(*) FROM (SELECT key FROM provider_calls GROUP BY key HAVING count(*) > 1) d`)
	if twice > held {
		t.Errorf("%d keys passed to the provider twice, more than the %d rows the killed instance held", twice, held)
	}
	if held == 0 {
		t.Log("the kill found no row held (the child was between batches): nothing to recover this time")
	}
	// Bounded by the lease, the recovery period and the drain itself,
	// with room for a loaded machine.
	if limit := recoverLease + recoverEvery + 20*time.Second; took > limit {
		t.Errorf("Drain took %v after the kill, over %v", took, limit)
	}
}

// exactlyOnceEffects fails t unless each of the n rows has exactly one
// effect.
func exactlyOnceEffects(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(DISTINCT job_id) FROM effects`); got != n {
		t.Errorf("%d rows with an effect, want %d", got, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id HAVING count(*) > 1) d`); got != 0 {
		t.Errorf("%d rows with more than one effect", got)
	}
}

// sep is what joins a parameter to url.
func sep(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}
