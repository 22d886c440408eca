package claim

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/pgprobe"
	"github.com/pgclaim/pgclaim/harness/standbytest"
)

// TestWorkerReadOnlyServer: the worker's address points at a hot standby
// (as a writer's DNS name does for a while after a failover), then at the
// primary. On the standby every claim is refused (SQLSTATE 25006): the
// worker says so once, not at every retry, and drops its pool's
// connections; once the address points at the primary, new connections
// reach it and every row is worked, once.
func TestWorkerReadOnlyServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair, primary := standbytest.New(t, ctx)
	createJobs(t, primary, "bigint", 20)
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}

	pc, address := pgprobe.SwitchConfig(t, pair.StandbyURL("app"))
	pc.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	logs := &messages{}
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Holder: "w", Lease: 10 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, WorkerConfig[int64]{Done: "DONE", Failed: "FAILED", BatchSize: 5, PollInterval: 100 * time.Millisecond,
		Work: func(ctx context.Context, tx pgx.Tx, cl Claim[int64]) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (job_id, holder, fence) VALUES ($1, 'w', $2)`, cl.Key, cl.Fence)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _, _ = w.Run(wctx) }()
	defer func() { stop(); <-done }()

	const onReader = "claim: worker: this connection reaches a read-only server (a standby, or the writer's address pointing at a reader after a failover): dropping the pool's connections and claiming again every PollInterval until the writer answers"
	time.Sleep(2 * time.Second) // about 20 claims, each refused
	logs.mu.Lock()
	said, other := 0, 0
	for _, m := range logs.got {
		if m == onReader {
			said++
		} else if m != "claim: worker: polls only: notifications cannot reach this process (a connection pooler in transaction mode)" {
			other++
		}
	}
	logs.mu.Unlock()
	if said != 1 {
		t.Errorf("the read-only server reported %d times in 2 s of refused claims, want once; logged %q", said, logs.got)
	}

	address.Point(t, pair.PrimaryURL("app"))
	deadline := time.Now().Add(30 * time.Second)
	for count(t, primary, `SELECT count(*) FROM jobs WHERE state = 'DONE'`) != 20 {
		if time.Now().After(deadline) {
			t.Fatalf("rows not worked within 30 s of the address pointing at the primary: %d done", count(t, primary, `SELECT count(*) FROM jobs WHERE state = 'DONE'`))
		}
		time.Sleep(50 * time.Millisecond)
	}
	exactlyOnceEffects(t, primary, 20)
}
