package pgprobe

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier runs one query; *pgxpool.Pool, *pgx.Conn and pgx.Tx are one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// State selects advisory locks by whether they are held.
type State int

const (
	Any     State = iota // held or waited for
	Granted              // held
	Waiting              // waited for
)

// Key is one advisory lock as pg_locks shows it: classid, objid and
// objsubid.
type Key struct {
	Class, Obj int32
	Sub        int16
}

// Pair is the lock pg_advisory_lock(class, key) takes (two int4 keys).
func Pair(class, key int32) Key { return Key{Class: class, Obj: key, Sub: 2} }

// Single is the lock pg_advisory_lock(key) takes (one int8 key).
func Single(key int64) Key { return Key{Class: int32(key >> 32), Obj: int32(key), Sub: 1} }

// where returns the condition selecting the current database's advisory
// locks in state s, of key k when k is given, and its arguments.
func where(s State, k []Key) (string, []any) {
	w := []string{"locktype = 'advisory'", "database = (SELECT oid FROM pg_database WHERE datname = current_database())"}
	switch s {
	case Granted:
		w = append(w, "granted")
	case Waiting:
		w = append(w, "NOT granted")
	}
	var args []any
	for _, k := range k {
		w = append(w, "classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = $3")
		args = append(args, k.Class, k.Obj, k.Sub)
	}
	return strings.Join(w, " AND "), args
}

// CountAdvisory counts the current database's advisory locks in state s;
// with a key, only those of that lock (give at most one).
func CountAdvisory(ctx context.Context, q Querier, s State, key ...Key) (int, error) {
	if len(key) > 1 {
		return 0, fmt.Errorf("pgprobe: CountAdvisory: %d keys, want at most one", len(key))
	}
	cond, args := where(s, key)
	var n int
	err := q.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE "+cond, args...).Scan(&n)
	return n, err
}

// AdvisoryHolder returns the pid of the backend holding the advisory lock
// k in the current database (pgx.ErrNoRows when none holds it).
func AdvisoryHolder(ctx context.Context, q Querier, k Key) (uint32, error) {
	cond, args := where(Granted, []Key{k})
	var pid uint32
	err := q.QueryRow(ctx, "SELECT pid FROM pg_locks WHERE "+cond, args...).Scan(&pid)
	return pid, err
}

// TerminateHolder ends the backend holding the advisory lock k in the
// current database (pg_terminate_backend), as a crashed holder or a
// network failure would; it returns how many it ended (0: none held it).
func TerminateHolder(ctx context.Context, q Querier, k Key) (int, error) {
	cond, args := where(Granted, []Key{k})
	var n int
	err := q.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE "+cond, args...).Scan(&n)
	return n, err
}
