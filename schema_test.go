package pgclaim_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

func TestSchemaInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, name := range []string{"Tenant", "a-b", `a"b`, "pg_x", "9a"} {
		err := pgclaim.Migrate(ctx, nil, pgclaim.WithSchema(name))
		if !errors.Is(err, pgclaim.ErrInvalid) || !strings.Contains(err.Error(), "WithSchema") {
			t.Errorf("WithSchema(%q): %v, want an error naming WithSchema", name, err)
		}
	}
	pool, err := pgxpool.New(ctx, "postgres://localhost:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := schedule.New(pool, schedule.Config{Schema: "Bad"}); err == nil || !strings.Contains(err.Error(), "Config.Schema") {
		t.Errorf("schedule: %v", err)
	}
	if _, err := gate.New(pool, gate.Config{Schema: "Bad"}); err == nil || !strings.Contains(err.Error(), "Config.Schema") {
		t.Errorf("gate: %v", err)
	}
	if _, err := gate.NewLease(pool, "x", gate.LeaseConfig{AtMost: time.Second, Schema: "Bad"}); err == nil || !strings.Contains(err.Error(), "LeaseConfig.Schema") {
		t.Errorf("lease: %v", err)
	}
	if _, err := claim.New[int64](pool, itemsTable("app.items"), claim.Config{From: "PAUSED", To: "PROCESSING", Schema: "Bad"}); err == nil || !strings.Contains(err.Error(), "Config.Schema") {
		t.Errorf("claim: %v", err)
	}
}

func itemsTable(name string) claim.Table {
	return claim.Table{Name: name, Key: "id", State: "status", ClaimedAt: "claimed_at", ClaimedBy: "claimed_by", Fence: "fence"}
}

// tenant is one installation of pgclaim in a schema of its own, used by
// two instances through pools whose search_path holds none of pgclaim's
// objects (pg_catalog alone, or the server's default behind PgBouncer).
type tenant struct {
	schema string
	pools  []*pgxpool.Pool
	lease  bool // behind PgBouncer in transaction mode: lease locks, ledger-only gates
}

// TestSchemasSideBySide runs two installations in schemas tenant_a and
// tenant_b of one database, through pools whose search_path is pg_catalog
// alone (tenant_b behind PgBouncer in transaction mode where it is
// installed): the same schedule, gate job and claim names in both; each
// runs every instant once and sees only its own rows.
func TestSchemasSideBySide(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDatabaseFrom(t, empty)
	for _, s := range []string{"tenant_a", "tenant_b"} {
		if err := pgclaim.Migrate(ctx, db.Pool, pgclaim.WithSchema(s)); err != nil {
			t.Fatalf("migrate %s: %v", s, err)
		}
		if err := pgclaim.Migrate(ctx, db.Pool, pgclaim.WithSchema(s)); err != nil { // again: nothing pending
			t.Fatalf("migrate %s again: %v", s, err)
		}
		st, err := pgclaim.MigrationStatus(ctx, db.Pool, pgclaim.WithSchema(s))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st {
			if !m.Applied {
				t.Errorf("%s: %s not applied", s, m.Name)
			}
		}
	}
	var inPublic []string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(relname::text), '{}') FROM pg_class
		WHERE relnamespace = 'public'::regnamespace AND relname LIKE 'pgclaim%'`).Scan(&inPublic); err != nil {
		t.Fatal(err)
	}
	if len(inPublic) > 0 {
		t.Errorf("pgclaim's objects in public: %v", inPublic)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA app;
		CREATE TABLE app.effects (tenant text NOT NULL, kind text NOT NULL, key text NOT NULL, fence bigint NOT NULL);
		CREATE TABLE app.items_a (id bigint PRIMARY KEY, status text NOT NULL, claimed_at timestamptz, claimed_by text, fence bigint);
		CREATE TABLE app.items_b (LIKE app.items_a INCLUDING ALL);
		INSERT INTO app.items_a (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 200) g;
		INSERT INTO app.items_b (id, status) SELECT g, 'PAUSED' FROM generate_series(1, 200) g;`); err != nil {
		t.Fatal(err)
	}

	open := func(url string, simple bool) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		if simple {
			// PgBouncer refuses search_path as a startup parameter; the
			// server's default ("$user", public) holds no pgclaim object.
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		} else {
			cfg.ConnConfig.RuntimeParams["search_path"] = "pg_catalog"
		}
		cfg.MaxConns = 4
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	a := tenant{schema: "tenant_a"}
	b := tenant{schema: "tenant_b"}
	bURL, simple := db.URL, false
	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	bnc, err := bouncer.Start(bctx, db.Server.URL(), db.Name)
	bcancel()
	switch {
	case errors.Is(err, bouncer.ErrNotFound) && os.Getenv("CI") != "true":
		t.Logf("PgBouncer not found: tenant_b runs on a direct pool (%v)", err)
	case err != nil:
		t.Fatalf("PgBouncer: %v", err)
	default:
		defer bnc.Stop()
		bURL, simple, b.lease = bnc.URL(db.Name, "schema-test"), true, true
	}
	for range 2 {
		a.pools = append(a.pools, open(db.URL, false))
		b.pools = append(b.pools, open(bURL, simple))
	}

	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var scheds []*schedule.Scheduler
	for _, tn := range []tenant{a, b} {
		for i, pool := range tn.pools {
			s, err := schedule.New(pool, schedule.Config{Schema: tn.schema, Holder: fmt.Sprintf("%s-%d", tn.schema, i),
				LeaseLocks: tn.lease, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			def := schedule.Definition{Name: "tick", Spec: "* * * * * *", TimeZone: "UTC", Version: 1}
			if err := s.Register(ctx, def, func(ctx context.Context, r schedule.Run) error {
				_, err := pool.Exec(ctx, `INSERT INTO app.effects VALUES ($1, 'run', $2, $3)`, tn.schema, r.Instant.UTC().Format(time.RFC3339Nano), r.Fence)
				return err
			}); err != nil {
				t.Fatalf("%s: register: %v", tn.schema, err)
			}
			scheds = append(scheds, s)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.Run(runCtx); err != nil && runCtx.Err() == nil {
					t.Errorf("%s: run: %v", tn.schema, err)
				}
			}()
			// claims: each instance claims its tenant's rows
			c, err := claim.New[int64](pool, itemsTable("app.items_"+tn.schema[len(tn.schema)-1:]),
				claim.Config{From: "PAUSED", To: "DONE", Holder: fmt.Sprintf("%s-%d", tn.schema, i), Schema: tn.schema, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Verify(ctx); err != nil {
				t.Fatalf("%s: verify: %v", tn.schema, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for runCtx.Err() == nil {
					cls, err := c.ClaimBatch(runCtx, 7)
					if err != nil {
						if runCtx.Err() == nil {
							t.Errorf("%s: claim: %v", tn.schema, err)
						}
						return
					}
					for _, cl := range cls {
						if _, err := pool.Exec(ctx, `INSERT INTO app.effects VALUES ($1, 'claim', $2, $3)`, tn.schema, fmt.Sprint(cl.Key), cl.Fence); err != nil {
							t.Errorf("%s: %v", tn.schema, err)
						}
					}
					if len(cls) == 0 {
						time.Sleep(20 * time.Millisecond)
					}
				}
			}()
			// gate: the same job and tick in every instance of both tenants
			g, err := gate.New(pool, gate.Config{Schema: tn.schema, Holder: fmt.Sprintf("%s-%d", tn.schema, i), LedgerOnly: tn.lease, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("%s: gate: %v", tn.schema, err)
			}
			for k := range 5 {
				at := start.Truncate(time.Second).Add(-time.Duration(k) * time.Second)
				err := g.Once(ctx, "job", at, func(ctx context.Context, r gate.Run) error {
					_, err := pool.Exec(ctx, `INSERT INTO app.effects VALUES ($1, 'once', $2, $3)`, tn.schema, at.UTC().Format(time.RFC3339), r.Fence)
					return err
				})
				if err != nil && !errors.Is(err, gate.ErrSkipped) && !errors.Is(err, gate.ErrHeld) {
					t.Errorf("%s: once: %v", tn.schema, err)
				}
			}
		}
	}
	// An operator's trigger in tenant_a is tenant_a's only.
	if _, created, err := scheds[0].Trigger(ctx, "tick"); err != nil || !created {
		t.Errorf("trigger: %v %v", created, err)
	}
	time.Sleep(4 * time.Second)
	stop()
	wg.Wait()

	for _, tn := range []string{"tenant_a", "tenant_b"} {
		var runs, distinct, once, claims, claimDistinct, triggered, ticks int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'run'), count(DISTINCT key) FILTER (WHERE kind = 'run'),
			count(*) FILTER (WHERE kind = 'once'), count(*) FILTER (WHERE kind = 'claim'), count(DISTINCT key) FILTER (WHERE kind = 'claim')
			FROM app.effects WHERE tenant = $1`, tn).Scan(&runs, &distinct, &once, &claims, &claimDistinct); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %s.pgclaim_schedule_runs WHERE kind = 'triggered'),
			(SELECT count(*) FROM %[1]s.pgclaim_ticks)`, tn)).Scan(&triggered, &ticks); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d runs (%d instants), %d gate runs, %d ticks, %d claims (%d rows), %d triggered", tn, runs, distinct, once, ticks, claims, claimDistinct, triggered)
		if runs < 3 || runs != distinct {
			t.Errorf("%s: %d runs of %d instants: want each instant once, at least 3", tn, runs, distinct)
		}
		if once != 5 || ticks != 5 {
			t.Errorf("%s: gate ran %d times, %d ticks: want 5 (one per tick, whatever the other tenant did)", tn, once, ticks)
		}
		if claims != 200 || claimDistinct != 200 {
			t.Errorf("%s: %d claims of %d rows: want each of 200 once", tn, claims, claimDistinct)
		}
		if want := map[string]int{"tenant_a": 1, "tenant_b": 0}[tn]; triggered != want {
			t.Errorf("%s: %d triggered runs, want %d", tn, triggered, want)
		}
	}
}
