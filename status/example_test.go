package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
	"github.com/pgclaim/pgclaim/status"
)

// An application mounts the status page under /pgclaim/ of its own mux.
// It is read-only here; with Config.Actions, wrap it in the application's
// authentication middleware first. Every view is also JSON.
func ExampleNew() {
	db, cleanup := exampleDatabase()
	defer cleanup()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)

	// The service stores a schedule (and would run it).
	svc, _ := schedule.New(db.Pool, schedule.Config{Logger: quiet})
	def := schedule.Definition{Name: "report", Spec: "0 6 * * *", TimeZone: "UTC", Version: 1}
	if err := svc.Register(ctx, def, func(context.Context, schedule.Run) error { return nil }); err != nil {
		panic(err)
	}

	page, err := status.New(status.Config{Pool: db.Pool, Logger: quiet})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/pgclaim/", http.StripPrefix("/pgclaim", page))

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/pgclaim/schedules.json", nil))
	var view status.Schedules
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil {
		panic(err)
	}
	s := view.Schedules[0]
	fmt.Println(rec.Code, s.Name, s.Spec, "next due at", s.NextDue.Format("15:04"), "paused:", s.Paused)

	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/pgclaim/actions/pause", nil))
	fmt.Println(rec.Code, "for an action: the page is read-only")
	// Output:
	// 200 report 0 6 * * * next due at 06:00 paused: false
	// 403 for an action: the page is read-only
}

func exampleDatabase() (*pgtest.Database, func()) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		panic(err)
	}
	db, err := srv.CreateDatabase(ctx, pgtest.Template{Name: "pgclaim"})
	if err != nil {
		panic(err)
	}
	return db, func() {
		_ = db.Drop(ctx)
		_ = srv.Close()
	}
}
