package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/pgtest/pgcontainer"
)

// provision finds the database: the given URL, else a fresh database on a
// server from pgtest (PGCLAIM_TEST_DATABASE_URL, Docker, local binaries).
func (o *orchestrator) provision(ctx context.Context) (url string, cleanup func(), err error) {
	if o.cfg.DatabaseURL != "" {
		pool, err := pgxpool.New(ctx, o.cfg.DatabaseURL)
		if err != nil {
			return "", nil, fmt.Errorf("--database-url: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return "", nil, fmt.Errorf("--database-url: %w", err)
		}
		o.pool, o.q = pool, db.New(pool)
		o.say("demo", "Postgres: the database from --database-url / DATABASE_URL (kept after the run)")
		return o.cfg.DatabaseURL, pool.Close, nil
	}
	o.say("demo", "no --database-url or DATABASE_URL: provisioning Postgres (Docker if an engine answers, else the local PostgreSQL binaries)")
	srv, err := pgtest.Start(ctx)
	if err != nil {
		return "", nil, err
	}
	closeSrv := func() { _ = srv.Close() }
	if srv.Source() != pgtest.SourceURL {
		// A server of our own, thrown away at the end: its maintenance
		// database will do.
		pool, err := pgxpool.New(ctx, srv.URL())
		if err != nil {
			closeSrv()
			return "", nil, err
		}
		o.pool, o.q = pool, db.New(pool)
		how := "a throwaway cluster from the local PostgreSQL binaries"
		if srv.Source() == pgtest.SourceContainer {
			how = "a container (testcontainers, " + pgcontainer.Image + ")"
		}
		o.say("demo", "Postgres: %s (removed at the end)", how)
		return srv.URL(), func() { pool.Close(); closeSrv() }, nil
	}
	// A shared server (PGCLAIM_TEST_DATABASE_URL): a database of our own.
	d, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pushresume_demo", Unmigrated: true})
	if err != nil {
		closeSrv()
		return "", nil, err
	}
	o.pool, o.q = d.Pool, db.New(d.Pool)
	o.say("demo", "Postgres: database %s on the server in %s (dropped at the end)", d.Name, pgtest.EnvURL)
	return d.URL, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Drop(ctx)
		closeSrv()
	}, nil
}

// prepare migrates, empties the demo's tables and seeds them.
func (o *orchestrator) prepare(ctx context.Context) error {
	if o.cfg.DatabaseURL != "" {
		t, err := o.q.DemoTables(ctx)
		if err != nil {
			return err
		}
		if t.PushRequests && !t.VersionTable {
			return errors.New("the database has a push_requests table this demo did not create; use an empty database")
		}
	}
	applied, err := migrate(ctx, o.pool)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		o.say("demo", "schema: applied %s", strings.Join(applied, ", "))
	} else {
		o.say("demo", "schema: up to date")
	}
	if err := o.q.ResetDemo(ctx); err != nil {
		return err
	}
	if err := o.q.ResetSchedule(ctx, job); err != nil {
		return err
	}
	cfg := o.cfg
	if cfg.Stuck > 0 {
		if _, err := o.q.SeedStuck(ctx, db.SeedStuckParams{
			N: int32(cfg.Stuck), AgeSeconds: (cfg.Instance.StaleAfter + time.Hour).Seconds(), Holder: "active:yesterday",
		}); err != nil {
			return err
		}
	}
	if _, err := o.q.SeedPaused(ctx, int32(cfg.Pushes)); err != nil {
		return err
	}
	o.say("demo", "seeded %d PAUSED pushes, and %d requests a crashed server left PROCESSING %s ago",
		cfg.Pushes, cfg.Stuck, durationText(cfg.Instance.StaleAfter+time.Hour))
	return nil
}
