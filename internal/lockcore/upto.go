package lockcore

// Sharing out locks: the callers of many processes that each want up to
// n of one set of locks (the schedules due at one instant, each process
// with room for n) take them in one statement each, every lock going to
// the first that tries it, as SKIP LOCKED shares out rows: no process
// tries a lock it then has no room for, and none waits for another.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgclaim/pgclaim/store"
)

// TryLocksUpTo takes, in one statement on the shared session, free locks
// of reqs in their order until n are taken (all of one Class). It returns
// the locks taken, by the index of their request (watched and released as
// TryLockBatched's are), and how many of reqs were tried: all of them
// unless n were taken, when the requests after the last one taken were
// not.
func (c *Sessions) TryLocksUpTo(ctx context.Context, reqs []LockRequest, n int) (map[int]Locked, int, error) {
	if len(reqs) == 0 || n <= 0 {
		return nil, 0, nil
	}
	bound := reqs[0].Validity
	keys := make([]int32, len(reqs))
	for i, r := range reqs {
		if r.Class != reqs[0].Class {
			return nil, 0, errors.New("lockcore: TryLocksUpTo: requests of more than one lock class")
		}
		bound = min(bound, r.Validity)
		keys[i] = r.Key
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var s *Session
	var rows []store.AdvisoryTryLocksUpToRow
	var sent time.Time
	var err error
	for try := 0; try < 2; try++ {
		if s, err = c.Get(ctx); err != nil {
			return nil, 0, fmt.Errorf("lock connection: %w", err)
		}
		sent = time.Now()
		rows, err = s.Q.AdvisoryTryLocksUpTo(ctx, store.AdvisoryTryLocksUpToParams{LockClass: reqs[0].Class, LockKeys: keys, UpTo: int32(n)})
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
		return nil, 0, fmt.Errorf("take locks: %w", err)
	}
	taken := make(map[int]Locked, len(rows))
	tried := len(reqs)
	for _, r := range rows {
		i := int(r.Pos) - 1
		if i < 0 || i >= len(reqs) {
			continue
		}
		k := s.register(WatchConfig{
			Every:    min(PingEvery, reqs[i].Validity/3),
			Validity: NewValidity(sent, reqs[i].Validity, nil),
		}, reqs[i].OnLost)
		taken[i] = Locked{Class: reqs[i].Class, Key: reqs[i].Key, Session: s, Keeper: k}
	}
	if len(rows) >= n {
		tried = 0
		for _, r := range rows {
			tried = max(tried, int(r.Pos))
		}
	}
	c.Put(s)
	return taken, tried, nil
}

// TryLocksUpTo is Sessions.TryLocksUpTo for this user: ErrClosed once it
// has closed its share.
func (r *Ref) TryLocksUpTo(ctx context.Context, reqs []LockRequest, n int) (map[int]Locked, int, error) {
	if r.closed.Load() {
		return nil, 0, ErrClosed
	}
	return r.Sessions.TryLocksUpTo(ctx, reqs, n)
}
