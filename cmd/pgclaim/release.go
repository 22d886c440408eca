package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/store"
)

const releaseAbout = `
Frees a lease lock (a row of pgclaim_locks) whose holder is gone or hung, so
that another instance can take it at once instead of waiting for it to expire.

The release is fenced: pgclaim reads the lease's current fencing token, shows
its holder and expiry, asks for confirmation (unless --yes), and then releases
the lease only if it still carries that token. If the lease changed hands in
between (it expired and another instance took it), nothing is released and
pgclaim says so. With --fence, the release happens only if the token is the
one given (for example as read from 'pgclaim locks'). When stdin is not a
terminal (a script), there is nobody to ask: pass --yes.

A holder that is still running finds its lease gone at its next extension and
stops (its run context is cancelled).

Advisory locks are not leases: the server releases them when their session
ends. To free one, end the session holding it (pg_terminate_backend(PID); see
'pgclaim locks').`

type releaseJSON struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Fence     int64     `json:"fence"`
	LockedAt  time.Time `json:"locked_at"`
	LockUntil time.Time `json:"lock_until"`
	Released  bool      `json:"released"`
	Result    string    `json:"result"` // released, not_held, changed_hands, declined
	Current   *leaseNow `json:"current,omitempty"`
}

// leaseNow is the lease as found after a release that did not happen.
type leaseNow struct {
	Holder    string    `json:"holder"`
	Fence     int64     `json:"fence"`
	LockUntil time.Time `json:"lock_until"`
	Held      bool      `json:"held"`
}

func runRelease(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "release", "release --lock NAME [--fence N] [--yes] [--database-url URL] [--json]", releaseAbout)
	name := f.String("lock", "", "the `NAME` of the lease lock to release (required)")
	yes := f.Bool("yes", false, "do not ask for confirmation")
	wantFence := f.Int64("fence", 0, "release only if the lease carries the fencing token `N`")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if err := require("lock", *name); err != nil {
		return err
	}
	if *wantFence < 0 {
		return usagef("--fence must be positive, got %d", *wantFence)
	}
	if !*yes {
		if err := canConfirm(e, "release a lease", ""); err != nil {
			return err
		}
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, "pgclaim_locks", "pgclaim_fence_seq"); err != nil {
		return err
	}
	q := store.New(pool)

	lease, err := q.LeaseByName(ctx, *name)
	if errors.Is(err, pgx.ErrNoRows) {
		return noLease(ctx, pool, *name)
	}
	if err != nil {
		return dbFail("reading lease "+*name, err)
	}
	out := releaseJSON{
		Name: lease.Name, Holder: lease.Holder, Fence: lease.Fence,
		LockedAt: lease.LockedAt.Time, LockUntil: lease.LockUntil.Time,
	}
	var remaining float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM $1::timestamptz - now())::float8`, lease.LockUntil).Scan(&remaining); err != nil {
		return dbFail("reading database time", err)
	}
	left := time.Duration(remaining * float64(time.Second))

	done := func(result string, cur *leaseNow, text string) error {
		out.Result, out.Current = result, cur
		if f.json {
			if err := writeJSON(e.stdout, out); err != nil {
				return err
			}
		} else if text != "" {
			fmt.Fprintln(e.stdout, text)
		}
		switch result {
		case "released", "not_held":
			return nil
		case "declined":
			return declined("not released")
		}
		return &failure{msg: fmt.Sprintf("lease %q not released: it changed hands", *name)}
	}

	if !lease.Held {
		return done("not_held", nil, fmt.Sprintf("lease %q is not held: it expired %s ago (%s, holder %s, fence %d); nothing to release",
			*name, fmtDur(-left), fmtTime(out.LockUntil), out.Holder, out.Fence))
	}
	if *wantFence != 0 && *wantFence != lease.Fence {
		return done("changed_hands", &leaseNow{Holder: lease.Holder, Fence: lease.Fence, LockUntil: out.LockUntil, Held: true},
			fmt.Sprintf("lease %q is held with fence %d by %s, not fence %d: it changed hands; nothing released",
				*name, lease.Fence, lease.Holder, *wantFence))
	}

	if !*yes {
		fmt.Fprintf(e.stderr, "lease %q is held by %s with fence %d since %s, until %s (%s left).\n",
			*name, out.Holder, out.Fence, fmtTime(out.LockedAt), fmtTime(out.LockUntil), fmtDur(left))
		if !confirm(e, "If that holder is still running, it stops at its next extension. Release it?") {
			return done("declined", nil, fmt.Sprintf("lease %q not released", *name))
		}
	}

	// Fenced: only the lease carrying the token read above, and only while
	// it is held. AtLeast 0: lock_until becomes now().
	n, err := q.ReleaseLease(ctx, store.ReleaseLeaseParams{Name: *name, Fence: lease.Fence, AtLeastUs: 0})
	if err != nil {
		return dbFail("releasing lease "+*name, err)
	}
	if n == 1 {
		out.Released = true
		return done("released", nil, fmt.Sprintf("released lease %q (holder %s, fence %d)", *name, out.Holder, out.Fence))
	}

	// Nothing released: see what happened meanwhile.
	cur, err := q.LeaseByName(ctx, *name)
	if err != nil {
		return dbFail("reading lease "+*name, err)
	}
	now := &leaseNow{Holder: cur.Holder, Fence: cur.Fence, LockUntil: cur.LockUntil.Time, Held: cur.Held}
	if cur.Fence != lease.Fence {
		state := "now held"
		if !cur.Held {
			state = "last held"
		}
		return done("changed_hands", now, fmt.Sprintf(
			"lease %q changed hands before the release: it is %s by %s with fence %d (was %s, fence %d); nothing released",
			*name, state, cur.Holder, cur.Fence, out.Holder, out.Fence))
	}
	return done("not_held", now, fmt.Sprintf("lease %q expired before the release (holder %s, fence %d); nothing to release",
		*name, out.Holder, out.Fence))
}

// noLease reports a name without a lease row, pointing at the session that
// holds an advisory lock of that name, if any.
func noLease(ctx context.Context, db dbtx, name string) error {
	hint := "see 'pgclaim locks' for the lease locks in this database"
	for _, k := range []struct {
		kind string
		key  func(string) (int32, int32)
	}{{"job", gate.AdvisoryKey}, {"election", gate.ElectionKey}} {
		class, key := k.key(name)
		var pid int32
		var app *string
		err := db.QueryRow(ctx, `
SELECT l.pid, a.application_name
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid
LIMIT 1`, class, key).Scan(&pid, &app)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return dbFail("reading pg_locks", err)
		}
		hint = fmt.Sprintf("an advisory lock of %s %q is held by backend pid %d (application %s); "+
			"it is freed when that session ends: SELECT pg_terminate_backend(%d)", k.kind, name, pid, strOrDash(app), pid)
		break
	}
	return failf(hint, "no lease lock named %q in pgclaim_locks", name)
}
