package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/store"
)

// The gates' floors: what each mechanism costs with nothing of the library
// around its statements, and what a tick ledger costs with nothing but the
// row that decides the tick. They bound what the mechanisms can reach: a
// mechanism is no faster than its own statements, and no ledger that
// records each instant is faster than a row per instant.

// floorDDL is the ledger reduced to its floor: the row that decides a tick
// (its primary key) and its outcome, no fencing token, no other index.
const floorDDL = `CREATE TABLE floor_ticks (
    job     text        NOT NULL,
    fire_at timestamptz NOT NULL,
    outcome text        NOT NULL DEFAULT 'running',
    fence   bigint,
    PRIMARY KEY (job, fire_at)
)`

// The floor ledger's two statements: the claim inserts the tick and, when
// it won, takes the job's lock (no row: claimed already); the finish
// records the outcome and unlocks. floorFencedClaimSQL also stamps the
// tick with a fencing token from pgclaim_fence(), durable with the row.
const (
	floorClaimSQL = `INSERT INTO floor_ticks (job, fire_at) VALUES ($1, $2)
ON CONFLICT (job, fire_at) DO NOTHING
RETURNING pg_try_advisory_lock($3::int4, $4::int4)`
	floorFencedClaimSQL = `INSERT INTO floor_ticks (job, fire_at, fence) VALUES ($1, $2, pgclaim_fence())
ON CONFLICT (job, fire_at) DO NOTHING
RETURNING pg_try_advisory_lock($3::int4, $4::int4)`
	floorFinishSQL = `UPDATE floor_ticks SET outcome = 'succeeded'
WHERE job = $1 AND fire_at = $2
RETURNING pg_advisory_unlock($3::int4, $4::int4)`
)

// errFloorLock is returned by a floor whose claim won its tick but found
// the job's lock held: it cannot happen where the floors run (one
// contender, or ticks fired together, whose previous run has unlocked).
var errFloorLock = errors.New("floor: the job's lock was held by another tick's run")

// floorMechs returns the floors of the gates scenario, on the job name.
func floorMechs(name string) []gateMech {
	ts := func(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

	ledgerFloor := func(claimSQL, jobName string) func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		return func(ctx context.Context, _ int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
			return ledgerFloorOp(ctx, pool, claimSQL, jobName, at, job)
		}
	}
	bare, fenced := ledgerFloor(floorClaimSQL, name+"-floor"), ledgerFloor(floorFencedClaimSQL, name+"-floor-fenced")
	onceSQL := func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		conn, closeFn, err := dedicatedConn(ctx, pool)
		if err != nil {
			return nil, nil, err
		}
		q := store.New(conn)
		jobName := name + "-once-sql"
		class, key := gate.AdvisoryKey(jobName)
		tol := gate.DefaultSkewTolerance.Microseconds()
		holder := fmt.Sprintf("c%d", c)
		return func(ctx context.Context, i int64) error {
			row, err := q.ClaimTick(ctx, store.ClaimTickParams{
				Job: jobName, FireAt: ts(at(i)), Holder: holder, ToleranceUs: &tol,
				LockMode: "try", LockClass: class, LockKey: key,
			})
			if err != nil {
				return claimErr(err)
			}
			job(i)
			unlocked, err := q.FinishTickUnlock(ctx, store.FinishTickUnlockParams{
				Outcome: "succeeded", Job: jobName, FireAt: ts(at(i)), Fence: row.Fence, LockClass: class, LockKey: key,
			})
			return released("gate.Once's statements: finish", unlocked, err)
		}, closeFn, nil
	}

	exclusiveSQL := func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		conn, closeFn, err := dedicatedConn(ctx, pool)
		if err != nil {
			return nil, nil, err
		}
		q := store.New(conn)
		class, key := gate.AdvisoryKey(name + "-exclusive-sql")
		return func(ctx context.Context, i int64) error {
			row, err := q.AdvisoryTryLock(ctx, store.AdvisoryTryLockParams{LockClass: class, LockKey: key})
			if err != nil {
				return err
			}
			if !row.Locked {
				return errHeldBaseline
			}
			job(i)
			unlocked, err := q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: class, LockKey: key})
			return released("gate.Exclusive's statements: unlock", unlocked, err)
		}, closeFn, nil
	}

	leaseSQL := func(ctx context.Context, c int, pool *pgxpool.Pool, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
		q := store.New(pool)
		lname, holder := name+"-lease-sql", fmt.Sprintf("c%d", c)
		atMost := (30 * time.Second).Microseconds()
		return func(ctx context.Context, i int64) error {
			row, err := q.AcquireLease(ctx, store.AcquireLeaseParams{Name: lname, Holder: holder, AtMostUs: atMost})
			if err != nil {
				return claimErr(err)
			}
			job(i)
			n, err := q.ReleaseLease(ctx, store.ReleaseLeaseParams{Name: lname, Fence: row.Fence})
			return released("gate.Lease's statements: release", n == 1, err)
		}, func() {}, nil
	}

	return []gateMech{
		{group: "floor", name: gateFloorLedger, ticks: true, exclusive: true, alone: true, setup: bare},
		{group: "floor", name: gateFloorLedger + gateTogether, ticks: true, exclusive: true, setup: bare, together: true},
		{group: "floor", name: gateFloorFenced, ticks: true, exclusive: true, alone: true, setup: fenced},
		{group: "floor", name: gateFloorFenced + gateTogether, ticks: true, exclusive: true, setup: fenced, together: true},
		{group: "floor", name: gateFloorOnce, ticks: true, exclusive: true, alone: true, setup: onceSQL},
		{group: "floor", name: gateFloorOnce + gateTogether, ticks: true, exclusive: true, setup: onceSQL, together: true},
		{group: "floor", name: gateFloorExclusive, exclusive: true, setup: exclusiveSQL},
		{group: "floor", name: gateFloorLease, exclusive: true, setup: leaseSQL},
	}
}

// The floors' names, as the report's ratios find them.
const (
	gateFloorLedger    = "ledger floor (primary key only, lock in the same statements)"
	gateFloorFenced    = "ledger floor with a fencing token"
	gateFloorOnce      = "gate.Once's statements, sent by hand"
	gateFloorExclusive = "gate.Exclusive's statements, sent by hand"
	gateFloorLease     = "gate.Lease's statements, sent by hand"
)

// ledgerFloorOp is one contender of a floor ledger: claimSQL and
// floorFinishSQL on a connection of its own, for ticks of jobName.
func ledgerFloorOp(ctx context.Context, pool *pgxpool.Pool, claimSQL, jobName string, at func(int64) time.Time, job func(i int64)) (gateOp, func(), error) {
	conn, closeFn, err := dedicatedConn(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	class, key := gate.AdvisoryKey(jobName)
	return func(ctx context.Context, i int64) error {
		var locked bool
		err := conn.QueryRow(ctx, claimSQL, jobName, at(i), class, key).Scan(&locked)
		switch {
		case err != nil:
			return claimErr(err)
		case !locked:
			return errFloorLock
		}
		job(i)
		var unlocked bool
		err = conn.QueryRow(ctx, floorFinishSQL, jobName, at(i), class, key).Scan(&unlocked)
		return released("floor: finish", unlocked, err)
	}, closeFn, nil
}

// dedicatedConn takes one connection out of a contender's pool for its
// whole run, as a gate's lock session is.
func dedicatedConn(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, func(), error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	conn := c.Hijack()
	return conn, func() { _ = conn.Close(context.Background()) }, nil
}

// released is the error of a floor's release statement: its own, or one
// saying that what it released was not held.
func released(what string, held bool, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case !held:
		return fmt.Errorf("%s: the lock was not held", what)
	}
	return nil
}

// claimErr is what a floor returns for its claim's error: a skip when the
// claim returned no row (another contender had it), else the error.
func claimErr(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return errHeldBaseline
	}
	return err
}
