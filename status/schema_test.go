package status_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status"
	"github.com/pgclaim/pgclaim/status/inspect"
)

// TestSchemaOfItsOwn: with Config.Schema the page reads an installation in
// a schema of its own through a pool whose search_path holds none of
// pgclaim's objects, and its locks view names the advisory locks that
// installation's schedules and elections hold (their keys are the
// schema's, not the default installation's).
func TestSchemaOfItsOwn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const schema = "ops"
	db := pgtest.NewDatabaseFrom(t, pgtest.Template{Name: "status_empty", Unmigrated: true})
	if err := pgclaim.Migrate(ctx, db.Pool, pgclaim.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "pg_catalog"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	quiet := slog.New(slog.DiscardHandler)

	// A schedule whose triggered run holds its lock until the test ends.
	s, err := schedule.New(pool, schedule.Config{Holder: "app", Logger: quiet, PollInterval: 100 * time.Millisecond, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	def := schedule.Definition{Name: "nightly", Spec: "0 3 * * *", TimeZone: "UTC", Version: 1}
	if err := s.Register(ctx, def, func(ctx context.Context, _ schedule.Run) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Trigger(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-ctx.Done():
		t.Fatal("the triggered run did not start")
	}

	// An election led through an advisory lock.
	e, err := gate.NewElector(pool, "leader", gate.ElectorConfig{Holder: "app", TTL: 5 * time.Second, Logger: quiet, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Resign(context.Background()) }()

	h, err := status.New(status.Config{Pool: pool, Schema: schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := srv.Client()

	all := getJSON[status.Schedules](t, c, srv.URL+"/schedules.json")
	if sc := findSchedule(t, all, "nightly"); !hasState(sc.Timeline, "running") {
		t.Errorf("nightly: want its running run, got %+v", sc)
	}
	leaders := getJSON[status.Leaders](t, c, srv.URL+"/leaders.json")
	if len(leaders.Open) != 1 || leaders.Open[0].Election != "leader" {
		t.Errorf("leaders: want the open term of leader, got %+v", leaders.Open)
	}
	locks := getJSON[inspect.Locks](t, c, srv.URL+"/locks.json")
	named := map[string]string{}
	for _, a := range locks.Advisory {
		if a.Granted && a.Owner == "pgclaim" {
			named[a.Kind] = a.Name
		}
	}
	if named["schedule"] != "nightly" || named["election"] != "leader" {
		t.Errorf("locks: want the schedule nightly's and the election leader's advisory locks named, got %+v", locks.Advisory)
	}
}
