package gate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestElectorRetention: a leader deletes its election's terms that ended
// longer ago than ElectorConfig.Retention, as a Gate deletes old ticks,
// and keeps recent ones and the open term; KeepTerms keeps them all.
func TestElectorRetention(t *testing.T) {
	electorVariants(t, func(t *testing.T, lease bool) {
		ctx := context.Background()
		for _, c := range []struct {
			retention time.Duration
			want      int
		}{{time.Hour, 2}, {gate.KeepTerms, 4}} {
			db := pgtest.NewDatabase(t)
			o := gate.ElectorConfig{Mechanism: mechanism(lease), TTL: time.Second, RetryInterval: 20 * time.Millisecond, Retention: c.retention}
			old := newElector(t, db.Pool, "scheduler", "old", o)
			for range 3 {
				if _, err := old.Campaign(ctx); err != nil {
					t.Fatal(err)
				}
				if err := old.Resign(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.Pool.Exec(ctx, `
				UPDATE pgclaim_terms SET started_at = started_at - interval '2 hours', ended_at = ended_at - interval '2 hours'
				WHERE term IN (SELECT term FROM pgclaim_terms ORDER BY term LIMIT 2)`); err != nil {
				t.Fatal(err)
			}
			// A new leader deletes the two old terms when it starts leading.
			e := newElector(t, db.Pool, "scheduler", "new", o)
			if _, err := e.Campaign(ctx); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			terms := checkTerms(t, db.Pool, "scheduler")
			for len(terms) != c.want && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				terms = checkTerms(t, db.Pool, "scheduler")
			}
			if c.retention == gate.KeepTerms {
				time.Sleep(500 * time.Millisecond)
				terms = checkTerms(t, db.Pool, "scheduler")
			}
			if len(terms) != c.want || terms[len(terms)-1].EndedAt != nil || terms[len(terms)-1].Term != e.Fence() {
				t.Errorf("retention %v: terms left %v; want %d, the open one last", c.retention, terms, c.want)
			}
			if err := e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	db := pgtest.NewDatabase(t)
	for _, r := range []time.Duration{time.Minute, -2 * time.Hour} {
		if _, err := gate.NewElector(db.Pool, "x", gate.ElectorConfig{Retention: r}); !errors.Is(err, gate.ErrInvalid) || !strings.Contains(err.Error(), "ElectorConfig.Retention") {
			t.Errorf("Retention %v: %v, want ErrInvalid naming ElectorConfig.Retention", r, err)
		}
	}
}
