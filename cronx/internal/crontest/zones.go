package crontest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/gate"
	"github.com/pgclaim/pgclaim/pgtest"
)

// The environment a TimeZones test hands its helper processes.
const (
	envHelper  = "PGCLAIM_CRONX_ZONE_HELPER" // "1" in a helper process
	envURL     = "PGCLAIM_CRONX_ZONE_URL"    // the database
	envLoc     = "PGCLAIM_CRONX_ZONE_LOC"    // the scheduler's location
	envSpec    = "PGCLAIM_CRONX_ZONE_SPEC"   // the daily spec, with seconds, without CRON_TZ
	envInstant = "PGCLAIM_CRONX_ZONE_AT"     // the instant spec names today, RFC 3339
)

// HostZones are the time.Local of the two instances a TimeZones test
// starts: neither is the scheduler's location, and they differ from each
// other by a fraction of an hour.
var HostZones = []string{"UTC", "Asia/Kolkata"}

// StartZone builds, in a helper process, an adapter's scheduler whose
// location is loc, running fn as the job called name on the daily spec
// (six fields, seconds first) through g, and starts it; it tells the
// adapter the scheduler's location. loc nil means a scheduler made without
// a location (time.Local) and a spec with a CRON_TZ= prefix, for which the
// adapter is told no location. It returns the function that stops the
// scheduler once its runs are over, and the adapter's catch-up for the job
// (window 48h) or nil when the adapter has none.
type StartZone func(g *gate.Gate, name string, loc *time.Location, spec string, fn gate.Func) (stop func(), catchUp func(context.Context) error, err error)

// TimeZones checks that a daily job of a scheduler whose location is not
// the host's runs once per instant across hosts whose time.Local differ.
// For each scheduler location L (Asia/Seoul, America/New_York) it picks an
// instant a few seconds ahead, writes it as a spec in L, and runs helper
// (the name of a test calling ZoneHelper) in one process per entry of
// HostZones, with TZ set to it. Each process runs two jobs: "daily", the
// spec on a scheduler whose location is L, and "daily-crontz", the spec
// prefixed with CRON_TZ=L on a scheduler without a location. Each fires
// its jobs when its schedulers reach the instant, then catches up; in the
// end each job must have run exactly once, for that instant.
func TimeZones(t *testing.T, helper string) {
	for _, locName := range []string{"Asia/Seoul", "America/New_York"} {
		t.Run(locName, func(t *testing.T) {
			t.Parallel()
			loc, err := time.LoadLocation(locName)
			if err != nil {
				t.Fatal(err)
			}
			db := pgtest.NewDatabase(t)
			if _, err := db.Pool.Exec(context.Background(), RunsTable); err != nil {
				t.Fatal(err)
			}
			instant := time.Now().Truncate(time.Second).Add(5 * time.Second)
			l := instant.In(loc)
			spec := fmt.Sprintf("%d %d %d * * *", l.Second(), l.Minute(), l.Hour())

			var wg sync.WaitGroup
			for _, host := range HostZones {
				wg.Go(func() {
					cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.v", "-test.count=1")
					cmd.Env = append(os.Environ(), "TZ="+host, envHelper+"=1", envURL+"="+db.URL,
						envLoc+"="+locName, envSpec+"="+spec, envInstant+"="+instant.Format(time.RFC3339Nano))
					var out bytes.Buffer
					cmd.Stdout, cmd.Stderr = &out, &out
					if err := cmd.Run(); err != nil {
						t.Errorf("instance with TZ=%s: %v\n%s", host, err, out.String())
					}
				})
			}
			wg.Wait()

			runs := RunsPerTick(t, db.Pool)
			for _, job := range zoneJobs {
				var got []string
				for at, hs := range runs {
					for _, h := range hs {
						if j, _, _ := strings.Cut(h, " "); j == job {
							got = append(got, at.Format(time.RFC3339)+" by "+h)
						}
					}
				}
				if want := instant.UTC().Format(time.RFC3339) + " by " + job + " "; len(got) != 1 || !strings.HasPrefix(got[0], want) {
					t.Errorf("job %s, spec %q in %s, instances with TZ=%v: runs %v; want exactly one, for %s (%s)",
						job, spec, locName, HostZones, got, instant.UTC().Format(time.RFC3339), l.Format(time.RFC3339))
				}
			}
		})
	}
}

// ZoneHelper is the body of the helper test a TimeZones test runs; in any
// other process it skips. It starts the adapter's scheduler with start,
// waits for the instant to pass, stops the scheduler, catches up, and
// fails unless this instance fired the job for the instant (its gate ran
// or skipped that tick) and the catch-up found nothing left to run.
func ZoneHelper(t *testing.T, start StartZone) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process of a TimeZones test")
	}
	ctx := context.Background()
	loc, err := time.LoadLocation(os.Getenv(envLoc))
	if err != nil {
		t.Fatal(err)
	}
	instant, err := time.Parse(time.RFC3339Nano, os.Getenv(envInstant))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, os.Getenv(envURL))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	holder := "TZ=" + os.Getenv("TZ")
	var mu sync.Mutex
	fired := map[string][]time.Time{}
	hooks := gate.HooksFunc(func(_ context.Context, e gate.Event) {
		if e.Kind == gate.EventAcquired || (e.Kind == gate.EventSkipped && errors.Is(e.Err, gate.ErrSkipped)) {
			mu.Lock()
			fired[e.Name] = append(fired[e.Name], e.FireAt)
			mu.Unlock()
		}
	})
	g, err := gate.New(pool, gate.Config{Holder: holder, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	spec := os.Getenv(envSpec)
	var stops []func()
	catchUps := map[string]func(context.Context) error{}
	for _, job := range zoneJobs {
		l, sp := loc, spec
		if job == "daily-crontz" {
			l, sp = nil, "CRON_TZ="+loc.String()+" "+spec
		}
		stop, catchUp, err := start(g, job, l, sp, func(ctx context.Context, run gate.Run) error {
			_, err := pool.Exec(ctx, `INSERT INTO runs VALUES ($1, $2)`, run.FireAt, run.Name+" "+run.Holder)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", job, err)
		}
		stops = append(stops, stop)
		catchUps[job] = catchUp
	}
	if late := time.Since(instant); late > -100*time.Millisecond {
		t.Fatalf("%s: the schedulers started %s after %s, too late to fire it (a slow machine)", holder, late, instant.Format(time.RFC3339Nano))
	}
	time.Sleep(time.Until(instant.Add(1500 * time.Millisecond)))
	for _, stop := range stops {
		stop()
	}
	for _, job := range zoneJobs {
		mu.Lock()
		handled := false
		for _, at := range fired[job] {
			handled = handled || at.Equal(instant)
		}
		mu.Unlock()
		if !handled {
			t.Errorf("%s (time.Local %s) never fired %s for %s (%s); its gate saw %v",
				holder, time.Local, job, instant.UTC().Format(time.RFC3339), instant.In(loc).Format(time.RFC3339), fired[job])
		}
		if catchUps[job] == nil {
			continue
		}
		if err := catchUps[job](ctx); !errors.Is(err, gate.ErrSkipped) {
			t.Errorf("%s: catch-up of %s after the run: got %v, want gate.ErrSkipped (the latest instant has run)", holder, job, err)
		}
	}
}

// zoneJobs are the jobs of a TimeZones helper.
var zoneJobs = []string{"daily", "daily-crontz"}
