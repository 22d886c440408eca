package lockcore

// Taking and releasing advisory locks on a session, and reserving their
// keys within the process.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// Reserve claims the advisory key (class, key) within this process before
// the lock is taken on the shared session, waiting up to wait for another
// caller's reservation to end: a session holds an advisory lock any number
// of times, so the server cannot keep two callers of one process apart. ok
// false means another caller here holds or is taking the lock. Call free
// once the lock is released or lost.
func (c *Sessions) Reserve(ctx context.Context, class, key int32, wait time.Duration) (free func(), ok bool) {
	k := [2]int32{class, key}
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		if c.reserved == nil {
			c.reserved = map[[2]int32]chan struct{}{}
		}
		ch, busy := c.reserved[k]
		if !busy {
			ch = make(chan struct{})
			c.reserved[k] = ch
			c.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					c.mu.Lock()
					delete(c.reserved, k)
					c.mu.Unlock()
					close(ch)
				})
			}, true
		}
		c.mu.Unlock()
		if wait <= 0 {
			return nil, false
		}
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
}

// TryLock takes the advisory lock (class, key), waiting up to wait (0: not
// at all). It returns a fencing token from pgclaim_fence(), made durable by
// the statement that grants it, or ok false when another session holds the
// lock.
func (s *Session) TryLock(ctx context.Context, class, key int32, wait time.Duration) (fence int64, ok bool, err error) {
	deadline := time.Now().Add(wait)
	for {
		row, err := s.Q.AdvisoryTryLock(ctx, store.AdvisoryTryLockParams{LockClass: class, LockKey: key})
		left := time.Until(deadline)
		if err != nil || row.Locked || left <= 0 {
			return row.Fence, row.Locked && err == nil, err
		}
		// Waiting on the server would keep the session from every other
		// lock of the process: try again shortly, the session free
		// meanwhile.
		s.c.give()
		t := time.NewTimer(min(retryLockEvery, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		_ = s.c.take(context.Background())
		s.c.mu.Lock()
		gone := s.c.cur != s || s.ended != nil
		s.c.mu.Unlock()
		if gone || s.Conn.IsClosed() {
			return 0, false, errors.New("the session ended while waiting for the lock")
		}
		if ctx.Err() != nil {
			return 0, false, ctx.Err()
		}
	}
}

// retryLockEvery is how often TryLock tries a lock held elsewhere while it
// waits.
const retryLockEvery = 25 * time.Millisecond

// Unlock releases the advisory lock (class, key) held by s and keeps s for
// reuse in c, or closes s when the unlock is not confirmed.
func (c *Sessions) Unlock(ctx context.Context, s *Session, class, key int32) {
	if ok, err := s.Q.AdvisoryUnlock(ctx, store.AdvisoryUnlockParams{LockClass: class, LockKey: key}); err != nil || !ok {
		s.Close()
		return
	}
	c.Put(s)
}
