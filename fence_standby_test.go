package pgclaim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/harness/roletest"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestSequenceFencePromotion: the sequence fence's stated limit, and its
// remedy. On a primary whose WAL functions are refused, with an
// asynchronous standby (Migrate on which leaves the fence alone, with no
// error): the standby is cut off, the primary grants and acknowledges
// tokens the standby never receives, dies, and the standby is promoted:
// its next sequence-fence token repeats one of them. Once the WAL functions
// are granted again, Migrate switches to the timeline fence, whose tokens
// are above every token granted before the promotion.
func TestSequenceFencePromotion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair := pgtest.NewPair(t, pgtest.PairConfig{})
	exec := func(url string, stmts ...string) {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		for _, s := range stmts {
			if _, err := c.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	exec(pair.PrimaryURL("postgres"), "CREATE DATABASE app")
	exec(pair.PrimaryURL("app"), "CREATE TABLE granted (fence bigint NOT NULL)")
	primary, err := pgxpool.New(ctx, pair.PrimaryURL("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	if err := pgclaim.Migrate(ctx, primary); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, primary, pgclaim.FenceTimeline, 1)
	// An instance starting against the standby: it reads no WAL insert
	// location, which is not a reason to switch (nor could it).
	if err := pair.WaitReplayed(ctx); err != nil {
		t.Fatal(err)
	}
	standby, err := pgxpool.New(ctx, pair.StandbyURL("app"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, standby); err != nil {
		t.Errorf("Migrate on the standby: %v", err)
	}
	standby.Close()

	exec(pair.PrimaryURL("app"), roletest.RevokeWAL)
	if err := pgclaim.Migrate(ctx, primary); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, primary, pgclaim.FenceSequence, 1)
	if err := pair.WaitReplayed(ctx); err != nil { // the switch is on the standby
		t.Fatal(err)
	}

	// Tokens granted and acknowledged (committed with a write) after the
	// standby is cut off: more than the sequence logs ahead (32).
	pair.StopStandby()
	var acked int64
	if err := primary.QueryRow(ctx, `WITH g AS (INSERT INTO granted SELECT pgclaim_fence() FROM generate_series(1, 100) RETURNING fence)
		SELECT max(fence) FROM g`).Scan(&acked); err != nil {
		t.Fatal(err)
	}
	primary.Close()
	pair.KillPrimary()
	if err := pair.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted, err := pgxpool.New(ctx, pair.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close()
	var tok int64
	if err := promoted.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&tok); err != nil {
		t.Fatal(err)
	}
	if tok > acked {
		t.Fatalf("sequence fence after an asynchronous promotion: %d, above the %d acknowledged before it; the documented limit is gone, update docs/MANAGED.md", tok, acked)
	}
	t.Logf("sequence fence: %d after the promotion, %d acknowledged before it", tok, acked)

	// The remedy: the WAL functions granted, the timeline fence.
	if _, err := promoted.Exec(ctx, roletest.GrantWAL); err != nil {
		t.Fatal(err)
	}
	if err := pgclaim.Migrate(ctx, promoted); err != nil {
		t.Fatal(err)
	}
	checkMode(ctx, t, promoted, pgclaim.FenceTimeline, 2)
	if err := promoted.QueryRow(ctx, "SELECT pgclaim_fence()").Scan(&tok); err != nil || tok <= acked {
		t.Fatalf("timeline fence after the promotion: %d (%v), want above %d", tok, err, acked)
	}
}
