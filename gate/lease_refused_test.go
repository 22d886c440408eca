package gate_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/internal/grants"
	"github.com/pgclaim/pgclaim/pgtest"
)

// appRole returns a role that is not a superuser, on a fresh database,
// granted what pgclaim's tables need.
func appRole(t *testing.T) *roletest.Role {
	t.Helper()
	app := roletest.New(t, pgtest.NewDatabase(t))
	if err := app.Grant(context.Background(), grants.Statements(app.Name, "public")...); err != nil {
		t.Fatal(err)
	}
	return app
}

// TestLeaseExtensionRefused: a role whose UPDATE on pgclaim_locks is
// revoked while it holds a lease loses the lease at the next keep-alive,
// not when its validity runs out, with the server's refusal as the reason
// (errors.As finds the *pgconn.PgError), and the refusal is logged once:
// the loss, with no warning per retry before it.
func TestLeaseExtensionRefused(t *testing.T) {
	ctx := context.Background()
	app := appRole(t)
	var (
		mu   sync.Mutex
		recs []string
	)
	const atMost, keepAlive = 6 * time.Second, 300 * time.Millisecond
	l, err := gate.NewLease(app.Pool, "refused", gate.LeaseConfig{AtMost: atMost, KeepAlive: keepAlive,
		Logger: slog.New(ctxHandler{mu: &mu, recs: &recs})})
	if err != nil {
		t.Fatal(err)
	}
	var revoked, lost time.Time
	err = l.Do(ctx, func(ctx context.Context, _ gate.Run) error {
		time.Sleep(keepAlive) // one extension goes through
		if err := app.Grant(ctx, "REVOKE UPDATE ON pgclaim_locks FROM ROLE"); err != nil {
			return err
		}
		revoked = time.Now()
		select {
		case <-ctx.Done():
			lost = time.Now()
		case <-time.After(atMost):
		}
		return nil
	})
	if lost.IsZero() {
		t.Fatalf("the job's context outlived the lease (Do: %v)", err)
	}
	if d := lost.Sub(revoked); d > 2*keepAlive+time.Second {
		t.Errorf("lost %v after the revoke, want within about one keep-alive (%v): a refusal is not retried", d.Round(time.Millisecond), keepAlive)
	}
	var pe *pgconn.PgError
	if !errors.Is(err, gate.ErrLockLost) || !errors.As(err, &pe) || pe.Code != "42501" {
		t.Errorf("Do: %v, want ErrLockLost wrapping the server's 42501", err)
	}
	if !strings.Contains(err.Error(), "pgclaim_locks") {
		t.Errorf("Do: %v, want the table named", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var failed, lostRecs int
	for _, r := range recs {
		switch {
		case strings.Contains(r, "extension failed"):
			failed++
		case strings.HasPrefix(r, "ERROR gate: lost"):
			lostRecs++
			if !strings.Contains(r, "42501") {
				t.Errorf("the loss's record does not carry the refusal: %s", r)
			}
		}
	}
	if failed != 0 || lostRecs != 1 {
		t.Errorf("%d warnings of a failed extension and %d loss records, want 0 and 1:\n%s", failed, lostRecs, strings.Join(recs, "\n"))
	}
}

// TestLeaseExtendRefused: without keep-alive, an Extend refused for good
// ends the lease at once: it returns ErrLockLost wrapping the refusal, and
// the handle's context ends with it.
func TestLeaseExtendRefused(t *testing.T) {
	ctx := context.Background()
	app := appRole(t)
	l, err := gate.NewLease(app.Pool, "refused", gate.LeaseConfig{AtMost: time.Minute, NoKeepAlive: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Grant(ctx, "REVOKE UPDATE ON pgclaim_locks FROM ROLE"); err != nil {
		t.Fatal(err)
	}
	err = h.Extend(ctx)
	var pe *pgconn.PgError
	if !errors.Is(err, gate.ErrLockLost) || !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("Extend: %v, want ErrLockLost wrapping the server's 42501", err)
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, gate.ErrLockLost) {
		t.Errorf("the handle's context: %v, want ended with ErrLockLost", cause)
	}
	if err2 := h.Extend(ctx); !errors.Is(err2, gate.ErrLockLost) {
		t.Errorf("a second Extend: %v, want the same loss", err2)
	}
}

// TestElectorLeaseRenewalRefused: a lease-variant leader whose UPDATE on
// pgclaim_terms is revoked steps down at its next renewal, with the
// server's refusal as the cause, and warns of no retry first.
func TestElectorLeaseRenewalRefused(t *testing.T) {
	ctx := context.Background()
	app := appRole(t)
	var (
		mu   sync.Mutex
		recs []string
	)
	const ttl = 8 * time.Second // renewed every 2s
	e, err := gate.NewElector(app.Pool, "refused", gate.ElectorConfig{Mechanism: gate.LeaseRow, TTL: ttl,
		Logger: slog.New(ctxHandler{mu: &mu, recs: &recs})})
	if err != nil {
		t.Fatal(err)
	}
	lead, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Grant(ctx, "REVOKE UPDATE ON pgclaim_terms FROM ROLE"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	select {
	case <-lead.Done():
	case <-time.After(ttl):
		t.Fatal("the leadership outlived its lease")
	}
	if d := time.Since(revoked); d > ttl/4+time.Second {
		t.Errorf("stepped down %v after the revoke, want by the next renewal (%v)", d.Round(time.Millisecond), ttl/4)
	}
	var pe *pgconn.PgError
	if cause := context.Cause(lead); !errors.Is(cause, gate.ErrLockLost) || !errors.As(cause, &pe) || pe.Code != "42501" {
		t.Errorf("the leadership's cause: %v, want ErrLockLost wrapping the server's 42501", cause)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		if strings.Contains(r, "renewal failed") {
			t.Errorf("a refused renewal was warned of as retried: %s", r)
		}
	}
}
