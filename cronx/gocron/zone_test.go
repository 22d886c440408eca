package gocron

import (
	"context"
	"testing"
	"time"

	gocronv2 "github.com/go-co-op/gocron/v2"

	"github.com/pgclaim/pgclaim/cronx/internal/crontest"
	"github.com/pgclaim/pgclaim/gate"
)

// TestTimeZones: a scheduler whose location (Asia/Seoul, America/New_York)
// is not the host's runs its daily task once per instant across two
// instances whose time.Local differ (UTC, Asia/Kolkata), each in its own
// process (see crontest.TimeZones).
func TestTimeZones(t *testing.T) {
	t.Parallel()
	crontest.TimeZones(t, "TestZoneHelper")
}

// TestZoneHelper is an instance of TestTimeZones.
func TestZoneHelper(t *testing.T) {
	crontest.ZoneHelper(t, func(g *gate.Gate, name string, loc *time.Location, spec string, fn gate.Func) (func(), func(context.Context) error, error) {
		sched, err := CronSchedule(spec, true, loc)
		if err != nil {
			return nil, nil, err
		}
		task, err := NewTask(g, name, sched, fn, TaskConfig{})
		if err != nil {
			return nil, nil, err
		}
		var sopts []gocronv2.SchedulerOption
		if loc != nil {
			sopts = append(sopts, gocronv2.WithLocation(loc))
		}
		s, err := gocronv2.NewScheduler(sopts...)
		if err != nil {
			return nil, nil, err
		}
		if _, err := s.NewJob(gocronv2.CronJob(spec, true), task, gocronv2.WithName(name)); err != nil {
			return nil, nil, err
		}
		s.Start()
		return func() { _ = s.Shutdown() }, nil, nil
	})
}
