package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/store"
)

// acquire takes the lease name for holder, for an hour, without keep-alive.
func acquire(t *testing.T, db *pgtest.Database, name, holder string) *gate.LeaseHandle {
	t.Helper()
	l, err := gate.NewLease(db.Pool, name, gate.LeaseConfig{
		Holder: holder, AtMost: time.Hour, NoKeepAlive: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("%s takes %s: %v", holder, name, err)
	}
	return h
}

// expire makes the lease run out now, as if its holder had stopped
// extending it an hour ago.
func expire(t *testing.T, db *pgtest.Database, name string) {
	t.Helper()
	exec1(t, db, `UPDATE pgclaim_locks SET lock_until = now() WHERE name = $1`, name)
}

func lease(t *testing.T, db *pgtest.Database, name string) store.LeaseByNameRow {
	t.Helper()
	row, err := store.New(db.Pool).LeaseByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	a := acquire(t, db, "report", "host-a:101")

	// Declined, or no answer: nothing happens.
	for _, stdin := range []string{"n\n", "", "maybe\n"} {
		r := cli(t, stdin, "release", "--lock", "report", "--database-url", db.URL)
		wantCode(t, r, exitError)
		wantContains(t, "stderr", r.stderr,
			fmt.Sprintf("lease \"report\" is held by host-a:101 with fence %d since ", a.Fence()),
			"left).\nIf that holder is still running, it stops at its next extension. Release it? [y/N] ",
			"pgclaim release: not released: no confirmation\nhint: answer y, or pass --yes\n")
		if r.stdout != "lease \"report\" not released\n" {
			t.Errorf("stdin %q: stdout = %q", stdin, r.stdout)
		}
		if l := lease(t, db, "report"); !l.Held || l.Fence != a.Fence() {
			t.Fatalf("stdin %q: lease changed: %+v", stdin, l)
		}
	}

	// Nobody to ask (stdin a pipe): refused, as a sweep is.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pw.WriteString("y\n")
	pw.Close()
	r0 := cliEnv(t, pr, map[string]string{}, "release", "--lock", "report", "--database-url", db.URL)
	wantCode(t, r0, exitError)
	if want := "pgclaim release: refusing to release a lease without confirmation: stdin is not a terminal\nhint: pass --yes to release a lease without asking\n"; r0.stderr != want {
		t.Errorf("stdin a pipe: stderr = %q, want %q", r0.stderr, want)
	}
	if l := lease(t, db, "report"); !l.Held || l.Fence != a.Fence() {
		t.Fatalf("stdin a pipe: lease changed: %+v", l)
	}

	// Confirmed: released, and the holder finds out at its next extension.
	r := cli(t, "y\n", "release", "--lock", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := fmt.Sprintf("released lease \"report\" (holder host-a:101, fence %d)\n", a.Fence()); r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	if l := lease(t, db, "report"); l.Held || l.Fence != a.Fence() {
		t.Errorf("lease after release: %+v", l)
	}
	if err := a.Extend(ctx); !errors.Is(err, gate.ErrLockLost) {
		t.Errorf("the released holder's Extend = %v, want ErrLockLost", err)
	}
	// Another instance takes it at once.
	b := acquire(t, db, "report", "host-b:202")

	// --yes, as JSON.
	r = cli(t, "", "release", "--lock", "report", "--yes", "--json", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	out := decodeJSON[releaseJSON](t, r.stdout)
	if !out.Released || out.Result != "released" || out.Name != "report" || out.Holder != "host-b:202" || out.Fence != b.Fence() ||
		out.Current != nil || !out.LockUntil.After(out.LockedAt) {
		t.Errorf("release JSON = %+v", out)
	}
	if r.stderr != "" {
		t.Errorf("--yes asked anyway: %q", r.stderr)
	}
	if l := lease(t, db, "report"); l.Held {
		t.Errorf("lease still held: %+v", l)
	}

	// A lease that is not held: nothing to do, and no question asked.
	r = cli(t, "", "release", "--lock", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "lease \"report\" is not held: it expired ",
		fmt.Sprintf("holder host-b:202, fence %d); nothing to release\n", b.Fence()))
	if r.stderr != "" {
		t.Errorf("stderr = %q", r.stderr)
	}
}

// takeover is a stdin that, when the CLI reads the operator's answer, first
// lets the lease change hands.
type takeover struct {
	fn     func()
	answer string
	done   bool
}

func (r *takeover) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	r.done = true
	r.fn()
	return copy(p, r.answer), nil
}

func TestReleaseChangedHands(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	a := acquire(t, db, "report", "host-a:101")
	expire(t, db, "report")
	b := acquire(t, db, "report", "host-b:202")

	// The operator read fence a in 'pgclaim locks'; the lease has moved on.
	r := cli(t, "", "release", "--lock", "report", "--fence", fmt.Sprint(a.Fence()), "--yes", "--database-url", db.URL)
	wantCode(t, r, exitError)
	if want := fmt.Sprintf("lease \"report\" is held with fence %d by host-b:202, not fence %d: it changed hands; nothing released\n",
		b.Fence(), a.Fence()); r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	wantContains(t, "stderr", r.stderr, "pgclaim release: lease \"report\" not released: it changed hands\n")
	if l := lease(t, db, "report"); !l.Held || l.Fence != b.Fence() {
		t.Fatalf("new holder's lease touched: %+v", l)
	}

	// The lease changes hands while the operator is asked.
	var c *gate.LeaseHandle
	stdin := &takeover{answer: "y\n", fn: func() {
		expire(t, db, "report")
		c = acquire(t, db, "report", "host-c:303")
	}}
	r = cliEnv(t, stdin, map[string]string{}, "release", "--lock", "report", "--database-url", db.URL)
	wantCode(t, r, exitError)
	if want := fmt.Sprintf("lease \"report\" changed hands before the release: it is now held by host-c:303 with fence %d "+
		"(was host-b:202, fence %d); nothing released\n", c.Fence(), b.Fence()); r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	if l := lease(t, db, "report"); !l.Held || l.Fence != c.Fence() || l.Holder != "host-c:303" {
		t.Fatalf("the new holder's lease was touched: %+v", l)
	}

	// The same as JSON.
	stdin = &takeover{answer: "y\n", fn: func() {
		expire(t, db, "report")
		c = acquire(t, db, "report", "host-d:404")
	}}
	prev := c.Fence()
	r = cliEnv(t, stdin, map[string]string{}, "release", "--lock", "report", "--json", "--database-url", db.URL)
	wantCode(t, r, exitError)
	out := decodeJSON[releaseJSON](t, r.stdout)
	if out.Released || out.Result != "changed_hands" || out.Fence != prev || out.Current == nil ||
		out.Current.Fence != c.Fence() || out.Current.Holder != "host-d:404" || !out.Current.Held {
		t.Errorf("release JSON = %+v (current %+v)", out, out.Current)
	}
	if l := lease(t, db, "report"); !l.Held || l.Fence != c.Fence() {
		t.Fatalf("the new holder's lease was touched: %+v", l)
	}

	// The lease expires (nobody takes it) while the operator is asked.
	stdin = &takeover{answer: "yes\n", fn: func() { expire(t, db, "report") }}
	r = cliEnv(t, stdin, map[string]string{}, "release", "--lock", "report", "--database-url", db.URL)
	wantCode(t, r, exitOK)
	if want := fmt.Sprintf("lease \"report\" expired before the release (holder host-d:404, fence %d); nothing to release\n", c.Fence()); r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
}

func TestReleaseErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	empty := unmigrated(t)
	r := cli(t, "", "release", "--lock", "report", "--yes", "--database-url", empty.URL)
	wantCode(t, r, exitError)
	if want := fmt.Sprintf("pgclaim release: database %q is not migrated: pgclaim's table pgclaim_locks does not exist\n"+
		"hint: run 'pgclaim migrate up' (or call pgclaim.Migrate at start-up) to create pgclaim's tables\n", empty.Name); r.stderr != want {
		t.Errorf("stderr = %q, want %q", r.stderr, want)
	}

	db := pgtest.NewDatabase(t)
	r = cli(t, "", "release", "--lock", "report", "--yes", "--database-url", db.URL)
	wantCode(t, r, exitError)
	if want := "pgclaim release: no lease lock named \"report\" in pgclaim_locks\nhint: see 'pgclaim locks' for the lease locks in this database\n"; r.stderr != want {
		t.Errorf("stderr = %q, want %q", r.stderr, want)
	}

	// The name of a job whose advisory lock is held: point at its session.
	g, err := gate.New(appPool(t, db, "svc-active"), gate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	running, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Exclusive(ctx, "push-resume", func(ctx context.Context, run gate.Run) error {
			close(running)
			<-finish
			return nil
		})
	}()
	<-running
	class, key := gate.AdvisoryKey("push-resume")
	pid, err := store.New(db.Pool).AdvisoryHolder(ctx, store.AdvisoryHolderParams{LockClass: class, LockKey: key})
	if err != nil {
		t.Fatal(err)
	}
	r = cli(t, "", "release", "--lock", "push-resume", "--yes", "--database-url", db.URL)
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, "pgclaim release: no lease lock named \"push-resume\" in pgclaim_locks\n",
		fmt.Sprintf("hint: an advisory lock of job \"push-resume\" is held by backend pid %d (application svc-active); "+
			"it is freed when that session ends: SELECT pg_terminate_backend(%d)\n", pid, pid))

	// A missing column.
	acquire(t, db, "report", "host-a:101")
	exec1(t, db, `ALTER TABLE pgclaim_locks DROP COLUMN fence`)
	r = cli(t, "", "release", "--lock", "report", "--yes", "--database-url", db.URL)
	wantCode(t, r, exitError)
	wantContains(t, "stderr", r.stderr, fmt.Sprintf("pgclaim release: table pgclaim_locks in database %q has no column \"fence\"\n", db.Name))
	if strings.Contains(r.stdout, "released") {
		t.Errorf("stdout = %q", r.stdout)
	}
}
