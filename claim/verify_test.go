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
	return WorkerConfig[int64]{Work: nopWork, Done: "DONE", Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 3, BatchSize: 10}
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
	c, err := New[int64](db.Pool, jobsTable, Options{From: "Paused", To: "PROCESSING"})
	if err != nil {
		t.Fatal(err)
	}
	wantInvalid(t, "Verify", c.Verify(ctx), "Options.From", `"Paused"`)
	_, err = NewWorker(c, okWorker())
	wantInvalid(t, "NewWorker", err, "Options.From", `"Paused"`)
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
	c, err := New[int64](db.Pool, jobsTable, Options{From: "PAUSED", To: "PROCESSING", Logger: logger})
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
	if err := w.Verify(ctx); !strings.Contains(err.Error(), `Options.From: no partial index of "jobs" is restricted to state "PAUSED"`) {
		t.Errorf("Worker.Verify = %v", err)
	}
	if err := sw.Verify(ctx); !strings.Contains(err.Error(), `Options.To: no partial index of "jobs" is restricted to state "PROCESSING"`) {
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
	sw, err := NewSweeper(c, SweeperConfig[int64]{StaleAfter: time.Hour, Failed: "FAILED", Retry: "PAUSED", MaxAttempts: 2, BatchSize: 10})
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
