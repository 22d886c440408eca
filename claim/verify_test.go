package claim

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/harness/roletest"
)

// stateTable creates table jobs like createJobs (no rows) but with the given
// type for the state column and extra DDL run before the indexes.
func stateTable(t *testing.T, db DBTX, stateType string, ddl ...string) {
	t.Helper()
	for _, s := range ddl {
		mustExec(t, db, s)
	}
	mustExec(t, db, `CREATE TABLE jobs (
		id bigint PRIMARY KEY,
		state `+stateType+` NOT NULL,
		claimed_at timestamptz,
		claimed_by text,
		fence bigint,
		lease_until timestamptz,
		attempts int NOT NULL DEFAULT 0)`)
}

func nopWork(context.Context, pgx.Tx, Claim[int64]) error { return nil }

func okWorker() WorkerConfig[int64] {
	return WorkerConfig[int64]{Work: nopWork, Done: "DONE", Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, BatchSize: 10}
}

func wantInvalid(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s = nil; want an error naming %q", what, words)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%s = %v; want ErrInvalid", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s = %v; want it to name %q", what, err, w)
		}
	}
}

// TestVerifyEnumLabel: a From that is not a label of the state column's
// enum (wrong case) is found by Verify and by NewWorker, naming the field.
func TestVerifyEnumLabel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	stateTable(t, db.Pool, "job_state", `CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'DONE', 'FAILED')`)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "Paused", To: "PROCESSING"})
	if err != nil {
		t.Fatal(err)
	}
	wantInvalid(t, "Verify", c.Verify(ctx), "Config.From", `"Paused"`)
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker", err, "Config.From", `"Paused"`)
}

// TestVerifyCheckFailed: a Failed state that the table's CHECK constraint
// does not allow makes NewWorker fail, naming WorkerConfig.Failed.
func TestVerifyCheckFailed(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	stateTable(t, db.Pool, "text CHECK (state IN ('PAUSED', 'PROCESSING', 'DONE', 'FAILED_PERMANENTLY'))")
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker", err, "WorkerConfig.Failed", `"FAILED"`)
	_, err = NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	wantInvalid(t, "NewSweeper", err, "SweeperConfig.Failed", `"FAILED"`)
}

// TestVerifyCheckDone: a Done state rejected by a CHECK constraint on a
// varchar column (deparsed with casts) makes NewWorker fail.
func TestVerifyCheckDone(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	stateTable(t, db.Pool, "varchar(20)")
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('PAUSED', 'PROCESSING', 'SENT', 'FAILED'))`)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker", err, "WorkerConfig.Done", `"DONE"`, "jobs_state_check")
}

// TestVerifyDomain: the CHECK constraints of a domain count like the
// table's; a domain over an enum is refused as a state column, naming it
// (PostgreSQL cannot compare it with a parameter).
func TestVerifyDomain(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	stateTable(t, db.Pool, "job_status",
		`CREATE DOMAIN job_status AS text CHECK (VALUE <> 'ARCHIVED' AND VALUE IN ('PAUSED', 'PROCESSING', 'DONE', 'FAILED', 'ARCHIVED'))`)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(c, okWorker()); err != nil {
		t.Fatalf("NewWorker with every state allowed: %v", err)
	}
	cfg := okWorker()
	cfg.Done = "done"
	_, err = NewWorker(c, cfg)
	wantInvalid(t, "NewWorker (Done not allowed)", err, "WorkerConfig.Done", `"done"`, "job_status_check")

	mustExec(t, db.Pool, `CREATE TYPE job_state AS ENUM ('PAUSED', 'PROCESSING', 'DONE', 'FAILED')`)
	mustExec(t, db.Pool, `CREATE DOMAIN job_state_d AS job_state`)
	mustExec(t, db.Pool, `CREATE TABLE enum_jobs (LIKE jobs)`)
	mustExec(t, db.Pool, `ALTER TABLE enum_jobs ADD PRIMARY KEY (id), ALTER state TYPE job_state_d USING state::job_state`)
	spec := jobsTable
	spec.Name = "enum_jobs"
	c, err = New[int64](db.Pool, spec, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	wantInvalid(t, "Verify (domain over an enum)", c.Verify(ctx), "Table.State", "job_state_d", "domain over an enum")
}

// TestVerifyChecksNotUnderstood: CHECK constraints Verify cannot read are
// not errors, and ones it can read, in every form, allow what they allow.
func TestVerifyChecksNotUnderstood(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	stateTable(t, db.Pool, "text")
	for _, ddl := range []string{
		`ALTER TABLE jobs ADD CHECK (length(state) < 20)`,
		`ALTER TABLE jobs ADD CHECK (state <> 'GONE')`,
		`ALTER TABLE jobs ADD CHECK (state = 'PAUSED' OR attempts >= 0)`,
		`ALTER TABLE jobs ADD CHECK (state = 'PAUSED' OR state = 'PROCESSING' OR state IN ('DONE', 'FAILED', 'it''s'))`,
		`ALTER TABLE jobs ADD CHECK (attempts >= 0 AND state = ANY (ARRAY['PAUSED', 'PROCESSING', 'DONE', 'FAILED']))`,
		`ALTER TABLE jobs ADD CHECK (NOT (state = 'PAUSED'))  NOT VALID`,
	} {
		mustExec(t, db.Pool, ddl)
	}
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(c, okWorker()); err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	cfg := okWorker()
	cfg.Failed = "DEAD"
	_, err = NewWorker(c, cfg)
	wantInvalid(t, "NewWorker (Failed not allowed)", err, "WorkerConfig.Failed", `"DEAD"`)
}

// TestNewSweeperLeaseOnlyWithoutLease: with StaleAfter zero the sweeper
// sweeps expired leases only; a claimer without a Lease writes none, so the
// row of a crashed holder would stay in To for ever. NewSweeper refuses.
func TestNewSweeperLeaseOnlyWithoutLease(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts) // no Lease
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewSweeper(c, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10})
	wantInvalid(t, "NewSweeper", err, "SweeperConfig.StaleAfter", "Config.Lease")
	leased, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSweeper(leased, SweeperConfig[int64]{Failed: "FAILED", BatchSize: 10}); err != nil {
		t.Fatalf("NewSweeper with a leased claimer: %v", err)
	}
}

// TestSweeperDefaultLogger: with no Config.Logger set, swept rows are
// logged to slog.Default().
func TestSweeperDefaultLogger(t *testing.T) {
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	buf := &syncWriter{w: new(bytes.Buffer)}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	makeStale(t, db.Pool, 1)
	if got, err := sw.Sweep(ctx); err != nil || len(got) != 1 {
		t.Fatalf("Sweep = %v, %v", got, err)
	}
	slog.SetDefault(old)
	if !strings.Contains(buf.String(), "claim: swept stale row") {
		t.Fatalf("default logger got %q; want the swept row", buf.String())
	}
}

// syncWriter serialises writes: the default logger may be used by tests
// running in parallel.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// TestVerifyIndexes: with every state allowed, a missing partial index is
// a warning matching ErrMissingIndex (and not ErrInvalid), naming the
// state; NewWorker and NewSweeper log it and do not fail. With the
// indexes, every Verify returns nil.
func TestVerifyIndexes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	stateTable(t, db.Pool, "text")
	buf := &syncWriter{w: new(bytes.Buffer)}
	logger := slog.New(slog.NewTextHandler(buf, nil))
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ctx); err != nil {
		t.Fatalf("Claimer.Verify = %v; want nil (it does not check indexes)", err)
	}
	w, err := NewWorker(c, okWorker())
	if err != nil {
		t.Fatalf("NewWorker without the index: %v", err)
	}
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10})
	if err != nil {
		t.Fatalf("NewSweeper without the index: %v", err)
	}
	for name, err := range map[string]error{"Worker.Verify": w.Verify(ctx), "Sweeper.Verify": sw.Verify(ctx)} {
		if !errors.Is(err, ErrMissingIndex) || errors.Is(err, ErrInvalid) {
			t.Fatalf("%s = %v; want ErrMissingIndex only", name, err)
		}
	}
	if err := w.Verify(ctx); !strings.Contains(err.Error(), `Config.From: no partial index of "jobs" is restricted to state "PAUSED"`) {
		t.Errorf("Worker.Verify = %v", err)
	}
	if err := sw.Verify(ctx); !strings.Contains(err.Error(), `Config.To: no partial index of "jobs" is restricted to state "PROCESSING"`) {
		t.Errorf("Sweeper.Verify = %v", err)
	}
	logs := buf.String()
	for _, want := range []string{"level=WARN msg=\"claim: NewWorker: missing partial index\"", "level=WARN msg=\"claim: NewSweeper: missing partial index\""} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs %q; want %q", logs, want)
		}
	}

	// A real problem is reported alone: the index warning does not hide it.
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD CHECK (state IN ('PAUSED', 'PROCESSING', 'DONE', 'FAILED'))`)
	bad := okWorker()
	bad.Done = "Done"
	bad.SkipVerify = true
	bw, err := NewWorker(c, bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.Verify(ctx); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrMissingIndex) {
		t.Fatalf("Worker.Verify with a bad Done = %v; want ErrInvalid only", err)
	}
	bad.SkipVerify = false
	if _, err := NewWorker(c, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewWorker with a bad Done = %v", err)
	}

	// Indexes whose predicates allow the state, in other forms, count;
	// one on another column or an invalid one does not.
	mustExec(t, db.Pool, `CREATE INDEX ON jobs (id) WHERE claimed_by = 'PAUSED'`)
	if err := w.Verify(ctx); !errors.Is(err, ErrMissingIndex) {
		t.Fatalf("Worker.Verify with an index on another column = %v", err)
	}
	mustExec(t, db.Pool, `CREATE INDEX ON jobs (id) WHERE state IN ('PAUSED', 'RETRY') AND attempts < 5`)
	mustExec(t, db.Pool, `CREATE INDEX ON jobs (lease_until) WHERE (state = 'PROCESSING')`)
	for name, err := range map[string]error{"Claimer.Verify": c.Verify(ctx), "Worker.Verify": w.Verify(ctx), "Sweeper.Verify": sw.Verify(ctx)} {
		if err != nil {
			t.Errorf("%s with the indexes = %v", name, err)
		}
	}
}

// TestVerifyAllRight: the tables the other tests use pass every Verify.
func TestVerifyAllRight(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 0)
	mustExec(t, db.Pool, `ALTER TABLE jobs ADD CHECK (state IN ('PAUSED', 'PROCESSING', 'DONE', 'FAILED'))`)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(c, okWorker())
	if err != nil {
		t.Fatal(err)
	}
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 2}, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Claimer.Verify": c.Verify(ctx), "Worker.Verify": w.Verify(ctx), "Sweeper.Verify": sw.Verify(ctx)} {
		if err != nil {
			t.Errorf("%s = %v", name, err)
		}
	}
}

// TestVerifySkip: SkipVerify builds a worker or sweeper without asking the
// database, which may not even have the table yet.
func TestVerifySkip(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	c, err := New[int64](db.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(c, okWorker()); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Table.Name") {
		t.Fatalf("NewWorker without the table = %v", err)
	}
	cfg := okWorker()
	cfg.SkipVerify = true
	if _, err := NewWorker(c, cfg); err != nil {
		t.Fatalf("NewWorker with SkipVerify = %v", err)
	}
	if _, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10, SkipVerify: true}); err != nil {
		t.Fatalf("NewSweeper with SkipVerify = %v", err)
	}
}

func TestAllowedStates(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string // nil: not understood
	}{
		{`(s = 'A'::text)`, []string{"A"}},
		{`(s = ANY (ARRAY['A'::text, 'B'::text]))`, []string{"A", "B"}},
		{`((s)::text = ANY ((ARRAY['A'::character varying, 'it''s'::character varying])::text[]))`, []string{"A", "it's"}},
		{`(("s" = 'X'::text) OR (s = 'Y'::text))`, []string{"X", "Y"}},
		{`((VALUE <> 'B'::t) AND (VALUE = ANY (ARRAY['A'::t, 'B'::t])))`, nil}, // column s, not VALUE
		{`((a > 0) AND (s = ANY (ARRAY['A'::text, 'B'::text])) AND (s = 'B'::text))`, []string{"B"}},
		{`((s = 'A'::text) OR (a > 0))`, nil},
		{`(s <> 'A'::text)`, nil},
		{`(NOT (s = 'A'::text))`, nil},
		{`(length(s) < 20)`, nil},
		{`(s = E'a\\b'::text)`, nil},
		{`(s = 'a'' OR s = ''b'::text)`, []string{"a' OR s = 'b"}},
		{`(t = 'A'::text)`, nil},
		{`("S" = 'A'::text)`, nil},
	} {
		got, ok := allowedStates(tc.expr, "s")
		if tc.want == nil {
			if ok {
				t.Errorf("allowedStates(%s) = %q; want not understood", tc.expr, got)
			}
			continue
		}
		if !ok || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("allowedStates(%s) = %q, %v; want %q", tc.expr, got, ok, tc.want)
		}
	}
	if got, ok := allowedStates(`(("Mixed ""Case""" = 'A'::text))`, `Mixed "Case"`); !ok || len(got) != 1 {
		t.Errorf("quoted column: %q %v", got, ok)
	}
}

// TestSweeperFailAfter: with FailAfter, stale rows claimed longer ago go
// to Failed whatever their attempts, younger ones to Retry while attempts
// remain; a row under a live lease is never swept, however old its claim.
func TestSweeperFailAfter(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 4)
	c, err := New[int64](db.Pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for id := int64(1); id <= 4; id++ {
		if _, err := c.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// 1: lease expired, claimed just now: retry.
	// 2: lease expired, claimed two days ago: failed.
	// 3: lease live, claimed two days ago: kept.
	// 4: lease expired, claimed just now, attempts used up: failed.
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 days' WHERE id IN (2, 3)`)
	mustExec(t, db.Pool, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id IN (1, 2, 4)`)
	mustExec(t, db.Pool, `UPDATE jobs SET attempts = 3 WHERE id = 4`)
	sw, err := NewSweeper(c, SweeperConfig[int64]{Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, FailAfter: 24 * time.Hour, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	got, err := sw.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[int64]Swept[int64]{}
	for _, s := range got {
		byKey[s.Key] = s
	}
	if len(got) != 3 || byKey[1].State != "PAUSED" || byKey[2].State != "FAILED" || byKey[4].State != "FAILED" {
		t.Fatalf("swept %+v", got)
	}
	if st := readRow(t, db.Pool, 3).State; st != "PROCESSING" {
		t.Fatalf("row 3 under a live lease is %s", st)
	}
	if r := byKey[2].Reason; !strings.Contains(r, "lease expired at") || !strings.Contains(r, "claimed more than 24h0m0s ago") {
		t.Errorf("reason of row 2: %q", r)
	}
	if r := byKey[1].Reason; strings.Contains(r, "claimed more than") {
		t.Errorf("reason of row 1: %q", r)
	}

	// Without a lease: StaleAfter decides staleness, FailAfter the state.
	plain, _ := New[int64](db.Pool, jobsTable, pausedOpts)
	for _, id := range []int64{1, 2} {
		if id == 2 {
			mustExec(t, db.Pool, `UPDATE jobs SET state = 'PAUSED' WHERE id = 2`)
		}
		if _, err := plain.Claim(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 hours', attempts = 1 WHERE id = 1`)
	mustExec(t, db.Pool, `UPDATE jobs SET claimed_at = claimed_at - interval '2 days', attempts = 1 WHERE id = 2`)
	sw, err = NewSweeper(plain, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, FailAfter: 24 * time.Hour, BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got, err = sw.Sweep(ctx); err != nil || len(got) != 2 {
		t.Fatalf("Sweep = %+v, %v", got, err)
	}
	if a, b := readRow(t, db.Pool, 1).State, readRow(t, db.Pool, 2).State; a != "PAUSED" || b != "FAILED" {
		t.Fatalf("rows 1, 2: %s, %s", a, b)
	}

	for _, tc := range []struct {
		field string
		cfg   SweeperConfig[int64]
	}{
		{"SweeperConfig.FailAfter", SweeperConfig[int64]{Failed: "FAILED", Retry: RetryPolicy{State: "PAUSED", MaxAttempts: 3}, FailAfter: -time.Hour, BatchSize: 10}},
		{"SweeperConfig.Retry.State", SweeperConfig[int64]{Failed: "FAILED", FailAfter: time.Hour, BatchSize: 10}},
	} {
		if _, err := NewSweeper(c, tc.cfg); !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "claim: "+tc.field+": ") {
			t.Errorf("NewSweeper(%+v) = %v; want ErrInvalid naming %s", tc.cfg, err, tc.field)
		}
	}
}

// TestSweeperRunSweepsAtOnce pins what Run's documentation says: its
// first sweep is at once, long before the first interval ends.
func TestSweeperRunSweepsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	quiet := pausedOpts
	quiet.Logger = slog.New(slog.DiscardHandler)
	c, _ := New[int64](db.Pool, jobsTable, quiet)
	if _, err := c.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	makeStale(t, db.Pool, 1)
	swept := make(chan []Swept[int64], 1)
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10,
		OnSwept: func(_ context.Context, s []Swept[int64]) { swept <- s }})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sw.Run(runCtx, time.Hour) }()
	select {
	case s := <-swept:
		if len(s) != 1 || s[0].Key != 1 {
			t.Errorf("swept %+v", s)
		}
	case <-ctx.Done():
		t.Fatal("Run did not sweep at once")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestVerifyUnreachable: a database NewWorker cannot ask is a warning, not
// a failure: nothing is known to be wrong with the configuration.
func TestVerifyUnreachable(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	buf := &syncWriter{w: new(bytes.Buffer)}
	c, err := New[int64](pool, jobsTable, Config{From: "PAUSED", To: "PROCESSING", Logger: slog.New(slog.NewTextHandler(buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(c, okWorker()); err != nil {
		t.Fatalf("NewWorker = %v", err)
	}
	if _, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10}); err != nil {
		t.Fatalf("NewSweeper = %v", err)
	}
	if got := strings.Count(buf.String(), "could not verify the table and states"); got != 2 {
		t.Fatalf("logs %q; want two warnings", buf.String())
	}
}

// TestVerifyPrivileges: a role with only SELECT on the table passes no
// longer: NewWorker fails naming UPDATE on the table and USAGE on the fence
// sequence, with the GRANTs that fix them, found from the catalog. With
// column grants covering what a claim touches, it passes, and the claim it
// promised works.
func TestVerifyPrivileges(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := newDB(t)
	createJobs(t, db.Pool, "bigint", 1)
	app := roletest.New(t, db, "GRANT SELECT ON jobs TO ROLE")
	c, err := New[int64](app.Pool, jobsTable, pausedOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker as a SELECT-only role", err, "Table.Name", `lacks UPDATE on table "jobs"`,
		`GRANT UPDATE ON TABLE "jobs" TO `+app.Ident(), "Table.Fence", "lacks USAGE on sequence pgclaim_fence_seq",
		"GRANT USAGE, SELECT ON SEQUENCE pgclaim_fence_seq TO "+app.Ident())
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", BatchSize: 10, SkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	err = sw.Verify(ctx)
	wantInvalid(t, "Sweeper.Verify as a SELECT-only role", err, `lacks UPDATE on table "jobs"`)
	if strings.Contains(err.Error(), "sequence") {
		t.Errorf("Sweeper.Verify = %v; a sweep takes no token", err)
	}

	if err := app.Grant(ctx, "GRANT UPDATE (state, claimed_at) ON jobs TO ROLE", "GRANT USAGE ON SEQUENCE pgclaim_fence_seq TO ROLE"); err != nil {
		t.Fatal(err)
	}
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker with UPDATE on two columns", err, `lacks UPDATE on columns claimed_by, fence, lease_until, attempts of table "jobs"`,
		`GRANT UPDATE ("claimed_by", "fence", "lease_until", "attempts") ON TABLE "jobs" TO `+app.Ident())

	if err := app.Grant(ctx, "GRANT UPDATE (claimed_by, fence, lease_until, attempts) ON jobs TO ROLE"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(c, okWorker()); err != nil {
		t.Fatalf("NewWorker with the privileges a claim needs = %v", err)
	}
	if _, err := c.Claim(ctx, 1); err != nil {
		t.Fatalf("Claim with the privileges Verify asked for = %v", err)
	}
}
