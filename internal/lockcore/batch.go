package lockcore

// Batched locking: the advisory locks that many callers of one process try
// at the same moment (hundreds of schedules due at one instant) are taken
// on the shared session in one statement, and released in one, instead of
// one round trip each while the others wait their turn for the session.
// A caller's request waits only for the statement in flight, if any, and
// then goes with every request that came meanwhile.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// LockRequest is one caller's lock for TryLockBatched.
type LockRequest struct {
	Class, Key int32
	// Validity is how long the statement that takes the lock confirms it
	// (the watch's WatchConfig.Validity, counted from the statement's send
	// time). It also bounds the statement: one cut short closes the
	// session, which drops the locks it took.
	Validity time.Duration
	// OnLost is the watch's: called once when the lock is lost.
	OnLost func(error)
}

// Locked is a lock TryLockBatched took: the advisory lock (Class, Key)
// held on Session, watched by Keeper.
type Locked struct {
	Class, Key int32
	Session    *Session
	Keeper     *Keeper
}

// batches holds the requests waiting for the next statement.
type batches struct {
	mu        sync.Mutex
	locks     []*lockCall
	locking   bool // a goroutine is taking locks
	unlocks   []*unlockCall
	unlocking bool // a goroutine is releasing locks
}

type lockCall struct {
	r   LockRequest
	res chan lockResult
}

type lockResult struct {
	l   Locked
	ok  bool
	err error
}

type unlockCall struct {
	s          *Session
	class, key int32
	done       chan struct{}
}

// TryLockBatched takes the advisory lock r names if it is free, without
// waiting for it, in one statement with the requests of every other caller
// of c meanwhile. ok false: another session holds it. A lock taken is
// watched as with Session.Watch (r.Validity, pings after
// min(PingEvery, r.Validity/3) of quiet, r.OnLost) and the session handed
// back; release it with ReleaseBatched. The fencing token of TryLock does
// not come with it: the caller's fence comes from elsewhere.
func (c *Sessions) TryLockBatched(r LockRequest) (Locked, bool, error) {
	call := &lockCall{r: r, res: make(chan lockResult, 1)}
	queue(&c.batch.mu, &c.batch.locks, &c.batch.locking, call, c.lockBatch)
	// Always answered, within the shortest validity of its batch.
	res := <-call.res
	return res.l, res.ok, res.err
}

// gather is how long a batch waits, from its first request, for the
// requests of the other callers due at the same moment (goroutines started
// one after another) before its statement goes: a round trip's worth at
// most, so that one statement takes what would otherwise be many.
const gather = 5 * time.Millisecond

// queue adds call to *q, under mu, and unless a goroutine already drains
// *q (busy), starts one: after gather, it runs each batch queued meanwhile
// through run until none is left.
func queue[T any](mu *sync.Mutex, q *[]T, busy *bool, call T, run func([]T)) {
	mu.Lock()
	*q = append(*q, call)
	start := !*busy
	*busy = true
	mu.Unlock()
	if !start {
		return
	}
	go func() {
		time.Sleep(gather)
		for {
			mu.Lock()
			calls := *q
			*q = nil
			if len(calls) == 0 {
				*busy = false
				mu.Unlock()
				return
			}
			mu.Unlock()
			run(calls)
		}
	}()
}

// lockBatch takes the locks of calls in one statement per lock class and
// answers each call.
func (c *Sessions) lockBatch(calls []*lockCall) {
	bound := calls[0].r.Validity
	for _, call := range calls {
		bound = min(bound, call.r.Validity)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	answer := func(err error) {
		for _, call := range calls {
			call.res <- lockResult{err: err}
		}
	}
	var s *Session
	var taken map[[2]int32]bool
	var sent time.Time
	var err error
	for try := 0; try < 2; try++ {
		if s, err = c.Get(ctx); err != nil {
			answer(fmt.Errorf("lock connection: %w", err))
			return
		}
		sent = time.Now()
		taken, err = tryLocks(ctx, s, calls)
		if err == nil {
			break
		}
		s.Close() // a lock may have been taken: closing drops it
		if !s.Ended(err) {
			break
		}
		// A session that ended while idle: once more, fresh.
	}
	if err != nil {
		answer(fmt.Errorf("take lock: %w", err))
		return
	}
	results := make([]lockResult, len(calls))
	for i, call := range calls {
		if !taken[[2]int32{call.r.Class, call.r.Key}] {
			continue
		}
		k := s.register(WatchConfig{
			Every:    min(PingEvery, call.r.Validity/3),
			Validity: NewValidity(sent, call.r.Validity, nil),
		}, call.r.OnLost)
		results[i] = lockResult{l: Locked{Class: call.r.Class, Key: call.r.Key, Session: s, Keeper: k}, ok: true}
	}
	c.Put(s)
	for i, call := range calls {
		call.res <- results[i]
	}
}

// tryLocks runs AdvisoryTryLocks on s for calls, one statement per lock
// class, and returns the locks taken.
func tryLocks(ctx context.Context, s *Session, calls []*lockCall) (map[[2]int32]bool, error) {
	keys := map[int32][]int32{}
	for _, call := range calls {
		keys[call.r.Class] = append(keys[call.r.Class], call.r.Key)
	}
	taken := map[[2]int32]bool{}
	for class, ks := range keys {
		got, err := s.Q.AdvisoryTryLocks(ctx, store.AdvisoryTryLocksParams{LockClass: class, LockKeys: ks})
		if err != nil {
			return nil, err
		}
		for _, k := range got {
			taken[[2]int32{class, k}] = true
		}
	}
	return taken, nil
}

// ReleaseBatched releases a lock TryLockBatched took: it stops the lock's
// watch, then unlocks it on its session in one statement with the releases
// of every other caller of c meanwhile, even when the lock's validity ran
// out (ErrExpired: a slow answer; the session keeps every other lock). A
// session that has ended took the lock with it; one whose unlock is not
// confirmed within SessionBound is closed.
func (c *Sessions) ReleaseBatched(l Locked) {
	// The session is not this caller's: its connection is looked at only
	// by the goroutine releasing the batch, which takes the session.
	if lost := l.Keeper.detachFn(); lost != nil && !errors.Is(lost, ErrExpired) {
		return // the session ended: the lock went with it
	}
	call := &unlockCall{s: l.Session, class: l.Class, key: l.Key, done: make(chan struct{})}
	queue(&c.batch.mu, &c.batch.unlocks, &c.batch.unlocking, call, func(calls []*unlockCall) {
		c.unlockBatch(calls)
		for _, call := range calls {
			close(call.done)
		}
	})
	<-call.done
}

// unlockBatch releases the locks of calls held on the current session in
// one statement per lock class; a lock of a session that is no longer the
// current one went with it.
func (c *Sessions) unlockBatch(calls []*unlockCall) {
	ctx, cancel := context.WithTimeout(context.Background(), SessionBound)
	defer cancel()
	if err := c.take(ctx); err != nil {
		return
	}
	c.mu.Lock()
	cur := c.cur
	c.mu.Unlock()
	keys := map[int32][]int32{}
	n := 0
	for _, call := range calls {
		if call.s == cur {
			keys[call.class] = append(keys[call.class], call.key)
			n++
		}
	}
	if n == 0 || cur.Conn.IsClosed() {
		c.give()
		return
	}
	for class, ks := range keys {
		got, err := cur.Q.AdvisoryUnlocks(ctx, store.AdvisoryUnlocksParams{LockClass: class, LockKeys: ks})
		if err != nil || len(got) != len(ks) {
			// Not confirmed: closing the session releases it for sure.
			cur.Close()
			return
		}
	}
	c.Put(cur)
}
