package shedlock

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// DDL creates ShedLock's table, named shedlock, with ShedLock's own schema.
const DDL = `
CREATE TABLE shedlock (
    name       varchar(64)  NOT NULL PRIMARY KEY,
    lock_until timestamptz  NOT NULL,
    locked_at  timestamptz  NOT NULL,
    locked_by  varchar(255) NOT NULL
)`

// ShedLock's statements: take the row when absent or expired, and on unlock
// keep it until locked_at + lockAtLeastFor. Arguments: name, a duration in
// microseconds (lockAtMostFor, lockAtLeastFor), holder.
const (
	lockSQL = `INSERT INTO shedlock (name, lock_until, locked_at, locked_by)
VALUES ($1, now() + $2::bigint * interval '1 microsecond', now(), $3)
ON CONFLICT (name) DO UPDATE
SET lock_until = EXCLUDED.lock_until, locked_at = EXCLUDED.locked_at, locked_by = EXCLUDED.locked_by
WHERE shedlock.name = EXCLUDED.name AND shedlock.lock_until <= now()`
	unlockSQL = `UPDATE shedlock
SET lock_until = CASE WHEN locked_at + $2::bigint * interval '1 microsecond' > now()
                      THEN locked_at + $2::bigint * interval '1 microsecond' ELSE now() END
WHERE name = $1 AND locked_by = $3`
)

// Execer runs one statement; *pgxpool.Pool, *pgx.Conn and pgx.Tx are one.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Create creates the shedlock table (DDL).
func Create(ctx context.Context, db Execer) error {
	_, err := db.Exec(ctx, DDL)
	return err
}

// Lock takes the lock name for holder until atMost from now, when it is
// free or expired; it reports whether it took it.
func Lock(ctx context.Context, db Execer, name, holder string, atMost time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, lockSQL, name, atMost.Microseconds(), holder)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// Unlock releases holder's lock name, keeping it taken until atLeast after
// it was locked. The row is matched by name and holder only: there is no
// fencing token.
func Unlock(ctx context.Context, db Execer, name, holder string, atLeast time.Duration) error {
	_, err := db.Exec(ctx, unlockSQL, name, atLeast.Microseconds(), holder)
	return err
}
