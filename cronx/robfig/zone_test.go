package robfig

import (
	"context"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
)

// TestTimeZones: a cron whose location (Asia/Seoul, America/New_York) is
// not the host's runs its daily job once per instant across two instances
// whose time.Local differ (UTC, Asia/Kolkata), each in its own process,
// and their catch-ups find that instant run (see crontest.TimeZones).
func TestTimeZones(t *testing.T) {
	t.Parallel()
	crontest.TimeZones(t, "TestZoneHelper")
}

// TestZoneHelper is an instance of TestTimeZones.
func TestZoneHelper(t *testing.T) {
	crontest.ZoneHelper(t, func(g *gate.Gate, name string, loc *time.Location, spec string, fn gate.Func) (func(), func(context.Context) error, error) {
		copts := []cron.Option{cron.WithSeconds()}
		if loc != nil {
			copts = append(copts, cron.WithLocation(loc))
		}
		c := cron.New(copts...)
		sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(spec)
		if err != nil {
			return nil, nil, err
		}
		job, err := NewJob(g, name, sched, fn, Config{Location: loc})
		if err != nil {
			return nil, nil, err
		}
		if _, err := c.AddJob(spec, job); err != nil {
			return nil, nil, err
		}
		c.Start()
		return func() { <-c.Stop().Done() }, func(ctx context.Context) error { return job.CatchUp(ctx, 48*time.Hour) }, nil
	})
}
