package lockcore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

// TestLapseKeepsSharedSession: when the shared session answers too slowly
// for its locks' validity (a starved server or client), each lock's run is
// told it is lost, but the session stays open and keeps every lock until
// its holder releases it. Closing the session there would free every lock
// of the process on the server at once, while the runs under them are
// still ending: another instance could start the same work beside them.
func TestLapseKeepsSharedSession(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	ss := lockcore.Share(db.Pool, nil)
	defer ss.Close()

	const validity = time.Second
	type lock struct {
		key  int32
		s    *lockcore.Session
		k    *lockcore.Keeper
		lost chan error
	}
	locks := []*lock{{key: 1, lost: make(chan error, 1)}, {key: 2, lost: make(chan error, 1)}}
	var pid uint32
	for _, l := range locks {
		s, err := ss.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		if _, ok, err := s.TryLock(ctx, 7, l.key, 0); err != nil || !ok {
			t.Fatalf("lock %d: ok %v, err %v", l.key, ok, err)
		}
		l.s, pid = s, s.Conn.PgConn().PID()
		v := lockcore.NewValidity(sent, validity, nil)
		l.k = s.Watch(ctx, lockcore.WatchConfig{Every: validity / 3, Validity: v}, func(err error) { l.lost <- err })
	}

	// The session answers nothing for twice the validity.
	s, err := ss.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Conn.Exec(ctx, `SELECT pg_sleep(2 * $1::float8)`, validity.Seconds()); err != nil {
		t.Fatal(err)
	}
	ss.Put(s)

	for _, l := range locks {
		select {
		case err := <-l.lost:
			if !errors.Is(err, lockcore.ErrExpired) {
				t.Errorf("lock %d lost with %v, want ErrExpired", l.key, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("lock %d: no loss reported after its validity ran out", l.key)
		}
	}
	held := func(key int32) bool {
		var free bool
		err := db.Pool.QueryRow(ctx, `SELECT pg_try_advisory_lock(7, $1)`, key).Scan(&free)
		if err != nil {
			t.Fatal(err)
		}
		if free {
			_, _ = db.Pool.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		}
		return !free
	}
	time.Sleep(200 * time.Millisecond)
	for _, l := range locks {
		if !held(l.key) {
			t.Errorf("lock %d was free for another session before its holder released it", l.key)
		}
	}

	// The holders release: each unlocks on the same session, which stays.
	for _, l := range locks {
		if err := l.k.Stop(); !errors.Is(err, lockcore.ErrExpired) {
			t.Errorf("lock %d: Stop returned %v, want ErrExpired", l.key, err)
		}
		ss.Unlock(ctx, l.s, 7, l.key)
		if held(l.key) {
			t.Errorf("lock %d still held after its holder released it", l.key)
		}
	}
	s, err = ss.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Conn.PgConn().PID(); got != pid {
		t.Errorf("the session was replaced (backend %d, then %d): a lapse closed it", pid, got)
	}
	ss.Put(s)
}
