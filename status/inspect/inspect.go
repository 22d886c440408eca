package inspect

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DB is what the reads query: a pool, a connection or a transaction.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Error is a failed read: What names it ("reading pgclaim_locks"), Err is
// the database's error.
type Error struct {
	What string
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %v", e.What, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

func fail(what string, err error) error { return &Error{What: what, Err: err} }
