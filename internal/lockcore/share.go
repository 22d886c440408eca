package lockcore

// Sharing one pool's Sessions among the users of a process (Share).

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/qualify"
)

// shared holds the Sessions of each pool that its users share (Share).
var shared = struct {
	mu sync.Mutex
	m  map[sharedKey]*Sessions
	n  map[*Sessions]int // users of each
}{m: map[sharedKey]*Sessions{}, n: map[*Sessions]int{}}

// sharedKey is what users share a Sessions by: the pool and the schema of
// pgclaim's objects its statements name.
type sharedKey struct {
	pool   *pgxpool.Pool
	schema string
}

// Ref is one user's share of the Sessions of a pool: every Gate and
// Scheduler of a process on the same pool holds its advisory locks on one
// session. Close ends this user's share; the session closes once the last
// user's is ended and no lock is held on it.
type Ref struct {
	*Sessions
	closed atomic.Bool
}

// Share returns a share of pool's Sessions for pgclaim's objects in schema
// (nil: found through search_path), created at the first share.
func Share(pool *pgxpool.Pool, schema *qualify.Schema) *Ref {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	k := sharedKey{pool, schema.Name()}
	c := shared.m[k]
	if c == nil {
		c = &Sessions{Pool: pool, Schema: schema, shared: true}
		shared.m[k] = c
	}
	shared.n[c]++
	return &Ref{Sessions: c}
}

// Get is Sessions.Get for this user: ErrClosed once it has closed its share.
func (r *Ref) Get(ctx context.Context) (*Session, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	return r.Sessions.Get(ctx)
}

// TryLockBatched is Sessions.TryLockBatched for this user: ErrClosed once
// it has closed its share.
func (r *Ref) TryLockBatched(req LockRequest) (Locked, bool, error) {
	if r.closed.Load() {
		return Locked{}, false, ErrClosed
	}
	return r.Sessions.TryLockBatched(req)
}

// Close ends this user's share.
func (r *Ref) Close() {
	if r.closed.Swap(true) {
		return
	}
	c := r.Sessions
	shared.mu.Lock()
	shared.n[c]--
	last := shared.n[c] == 0
	if last {
		delete(shared.n, c)
		if k := (sharedKey{c.Pool, c.Schema.Name()}); shared.m[k] == c {
			delete(shared.m, k)
		}
	}
	shared.mu.Unlock()
	if last {
		c.Close()
	}
}
