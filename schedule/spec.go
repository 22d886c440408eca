package schedule

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

// cronSpec is a parsed cron spec in a time zone.
type cronSpec struct {
	spec, zone string
	loc        *time.Location
	sched      cron.Schedule
}

var specParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSpec parses spec (five fields, or six with seconds first, or a
// descriptor such as @daily) in the IANA zone ("" is UTC).
func parseSpec(spec, zone string) (*cronSpec, error) {
	if zone == "" {
		zone = "UTC"
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, invalid("TimeZone", fmt.Sprintf("%q is not a known IANA time zone", zone))
	}
	s, err := specParser.Parse(spec)
	if err != nil {
		return nil, invalid("Spec", fmt.Sprintf("%q: %v", spec, err))
	}
	return &cronSpec{spec: spec, zone: zone, loc: loc, sched: s}, nil
}

// next returns the first instant strictly after t, in UTC; zero if none.
func (c *cronSpec) next(t time.Time) time.Time {
	n := c.sched.Next(t.In(c.loc))
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

// between returns the instants in (from, to], ascending, at most max, and
// whether more follow.
func (c *cronSpec) between(from, to time.Time, max int) ([]time.Time, bool) {
	var out []time.Time
	for t := c.next(from); !t.IsZero() && !t.After(to); t = c.next(t) {
		if len(out) == max {
			return out, true
		}
		out = append(out, t)
	}
	return out, false
}

func (c *cronSpec) String() string { return c.spec + " (" + c.zone + ")" }
