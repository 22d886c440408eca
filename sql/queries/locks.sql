-- Lease locks (gate.Lease). Every statement stands alone: no session state,
-- so they work through PgBouncer in transaction pooling mode. All times are
-- the database's; durations are passed in microseconds.

-- name: AcquireLease :one
-- Take the lease on name until now() + at_most, with a fresh fencing token.
-- An existing row is taken over only when it has expired. The WHERE of the
-- DO UPDATE applies to the one conflicting row, so only this name can ever be
-- taken over. No row returned: the lease is held elsewhere.
INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence)
VALUES (sqlc.arg(name)::text, sqlc.arg(holder)::text, now(),
        now() + sqlc.arg(at_most_us)::bigint * interval '1 microsecond',
        pgclaim_fence())
ON CONFLICT (name) DO UPDATE
SET holder     = excluded.holder,
    locked_at  = excluded.locked_at,
    lock_until = excluded.lock_until,
    fence      = excluded.fence
WHERE pgclaim_locks.lock_until <= now()
RETURNING fence, locked_at, lock_until;

-- name: AcquireLeases :many
-- AcquireLease for many names at once, each until now() + its at_most:
-- returns the name and fresh fence of each lease taken; the others are
-- held elsewhere. Names must be distinct; rows are taken in name order, so
-- that instances trying the same names at once wait for each other rather
-- than deadlock.
INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence)
SELECT v.name, sqlc.arg(holder)::text, now(), now() + v.at_most_us * interval '1 microsecond', pgclaim_fence()
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name, unnest(sqlc.arg(at_most_us)::bigint[]) AS at_most_us) AS v
ORDER BY v.name
ON CONFLICT (name) DO UPDATE
SET holder     = excluded.holder,
    locked_at  = excluded.locked_at,
    lock_until = excluded.lock_until,
    fence      = excluded.fence
WHERE pgclaim_locks.lock_until <= now()
RETURNING name, fence;

-- name: SeizeLeases :many
-- Take the leases on names, each until now() + its at_most with a fresh
-- fencing token, whoever held them: for a caller that holds every name's
-- advisory lock, which proves the previous holder's session has ended
-- (schedule's default locks; the runners whose schedules came due
-- together). Every statement guarded by a previous fence fails from then on. Names
-- must be distinct; rows are taken in name order.
INSERT INTO pgclaim_locks (name, holder, locked_at, lock_until, fence)
SELECT v.name, sqlc.arg(holder)::text, now(), now() + v.at_most_us * interval '1 microsecond', pgclaim_fence()
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name, unnest(sqlc.arg(at_most_us)::bigint[]) AS at_most_us) AS v
ORDER BY v.name
ON CONFLICT (name) DO UPDATE
SET holder     = excluded.holder,
    locked_at  = excluded.locked_at,
    lock_until = excluded.lock_until,
    fence      = excluded.fence
RETURNING name, fence;

-- name: ReleaseLeases :exec
-- ReleaseLease (with at_least 0) for many leases at once, each only where
-- it is still held with its fence.
UPDATE pgclaim_locks l
SET lock_until = now()
FROM (SELECT unnest(sqlc.arg(names)::text[]) AS name, unnest(sqlc.arg(fences)::bigint[]) AS fence) AS v
WHERE l.name = v.name AND l.fence = v.fence AND l.lock_until > now();

-- name: ExtendLease :one
-- Push lock_until to now() + at_most, only for the holder of this fence and
-- only while the lease has not expired. No row returned: expired or taken over.
UPDATE pgclaim_locks
SET lock_until = now() + sqlc.arg(at_most_us)::bigint * interval '1 microsecond'
WHERE name = sqlc.arg(name)::text
  AND fence = sqlc.arg(fence)::bigint
  AND lock_until > now()
RETURNING lock_until;

-- name: ReleaseLease :execrows
-- Release the lease held with this fence, keeping it until locked_at +
-- at_least: a fast job stays locked long enough that an instance firing a
-- little late still finds it held. 0 rows: expired or taken over before the
-- release; a newer holder's lease is never touched.
UPDATE pgclaim_locks
SET lock_until = greatest(now(), locked_at + sqlc.arg(at_least_us)::bigint * interval '1 microsecond')
WHERE name = sqlc.arg(name)::text
  AND fence = sqlc.arg(fence)::bigint
  AND lock_until > now();

-- name: LeaseByName :one
-- The lease row of name, with whether it is held now (for operators and tests).
SELECT name, holder, locked_at, lock_until, fence, (lock_until > now())::boolean AS held
FROM pgclaim_locks
WHERE name = sqlc.arg(name)::text;
