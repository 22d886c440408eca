package gate_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// syncBuffer is a bytes.Buffer safe for a logger written from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Two names whose 32-bit FNV-1a hashes collide.
const collideA, collideB = "election-5688", "election-1944856"

// The documented cost of an ElectionKey collision: with the advisory
// variant, the second election has no leader while the first one's leader
// lives, and its candidate says so in a warning naming the other election;
// it leads once that leader resigns. The lease variant is not affected.
func TestElectionKeyCollision(t *testing.T) {
	if _, a := gate.ElectionKey(collideA); func() bool { _, b := gate.ElectionKey(collideB); return a != b }() {
		t.Fatalf("%q and %q no longer collide", collideA, collideB)
	}
	electorVariants(t, func(t *testing.T, lease bool) {
		db := pgtest.NewDatabase(t)
		ctx := context.Background()
		var logs syncBuffer
		o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: 300 * time.Millisecond, RetryInterval: 20 * time.Millisecond}
		a := newElector(t, db.NewPool(t), collideA, "leader-a", o)
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		b := newElector(t, db.NewPool(t), collideB, "candidate-b", o)
		if _, err := a.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		won := make(chan error, 1)
		go func() {
			_, err := b.Campaign(ctx)
			won <- err
		}()
		if !lease {
			select {
			case err := <-won:
				t.Fatalf("advisory: %q led while %q's leader lives (err %v): the keys no longer collide?", collideB, collideA, err)
			case <-time.After(3 * o.TTL):
			}
			deadline := time.After(10 * time.Second)
			for !strings.Contains(logs.String(), "colliding_election="+collideA) {
				select {
				case <-deadline:
					t.Fatalf("no warning naming %q after 10s; logs: %q", collideA, logs.String())
				case err := <-won:
					t.Fatalf("Campaign returned %v before the warning", err)
				case <-time.After(10 * time.Millisecond):
				}
			}
			t.Logf("warning: %s", strings.TrimSpace(logs.String()))
			if err := a.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-won:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q never led", collideB)
		}
		if lease && !a.IsLeader() {
			t.Fatal("lease: the first leader lost its lead")
		}
		_ = b.Resign(ctx)
		_ = a.Resign(ctx)
	})
}
