package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronParser reads the fields: 5 ("min hour dom month dow"), 6 with seconds
// first, or a descriptor. Its own time arithmetic is not used (see next).
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// starBit marks a field written "*" or "?" in the parser's bit sets: a day
// field with it does not widen the other day field's match.
const starBit = 1 << 63

// searchYears bounds next's search.
const searchYears = 5

// cronSpec is a parsed cron spec in an IANA time zone. Its instants are
// wall-clock times in that zone mapped to UTC by the rule on parseSpec.
type cronSpec struct {
	spec, zone string
	loc        *time.Location

	// Bit sets of the allowed values, as the parser builds them: bit v set
	// means value v matches; dom and dow may carry starBit.
	second, minute, hour, dom, month, dow uint64

	// never is true when no calendar date matches (e.g. "0 0 30 2 *").
	never bool
}

// parseSpec parses a cron spec evaluated in the IANA zone named by zone.
// Accepted: 5 fields "min hour dom month dow", 6 fields with seconds first,
// and the descriptors @yearly @annually @monthly @weekly @daily @midnight
// @hourly. Month and weekday names (JAN, MON), ranges, lists and steps are
// read as robfig/cron v3 reads them; weekdays are 0-6 (Sunday 0). When both
// day-of-month and day-of-week are restricted, a day matching either runs.
// Refused (an error wrapping ErrInvalid naming the field "Spec" or "Zone"):
// an empty spec, a CRON_TZ=/TZ= prefix (the zone is separate), @every (the
// error names the spec to write), malformed or out-of-range fields and
// unknown names (the error names the field), an empty zone, "Local" (the
// host's zone differs between instances), an unknown zone. A spec no date
// matches parses (never is set); Definition refuses it.
//
// Time zones and daylight saving time: instants are computed from
// wall-clock times in the zone and returned in UTC, and each scheduled
// wall-clock time runs once, none is dropped:
//   - A wall-clock time that does not exist (spring forward) runs once at the
//     first instant after the gap, the transition: Europe/Berlin 2027-03-28
//     02:30 runs at 03:00 CEST (01:00Z). Several such times (a per-minute
//     spec over the gap) coalesce into that one instant, which is also the
//     instant of wall-clock 03:00 if the spec names it, so each instant
//     appears once and instants are strictly increasing.
//   - A wall-clock time that occurs twice (fall back) runs once, at its first
//     occurrence (the earlier UTC instant); the repeated interval does not
//     run again: Europe/Berlin 2027-10-31 02:30 runs at 02:30 CEST (00:30Z)
//     only.
func parseSpec(spec, zone string) (*cronSpec, error) {
	s := strings.TrimSpace(spec)
	switch {
	case s == "":
		return nil, invalid("Spec", "empty; give a cron spec such as \"0 9 * * *\"")
	case strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ="):
		return nil, invalid("Spec", fmt.Sprintf("%q: a time zone prefix is not accepted; the zone is given separately", spec))
	case strings.HasPrefix(s, "@every"):
		return nil, invalid("Spec", fmt.Sprintf("%q: @every is not accepted: a schedule's instants are wall-clock times, the same on every instance; %s",
			spec, everyInstead(strings.TrimSpace(strings.TrimPrefix(s, "@every")))))
	}
	for _, f := range strings.Fields(s) {
		if strings.HasPrefix(f, ",") || strings.HasSuffix(f, ",") || strings.Contains(f, ",,") {
			return nil, invalid("Spec", fmt.Sprintf("%q: empty list item in %q", spec, f))
		}
	}
	if msg := checkFields(strings.Fields(s)); msg != "" {
		return nil, invalid("Spec", fmt.Sprintf("%q: %s", spec, msg))
	}
	parsed, err := cronParser.Parse(s)
	if err != nil {
		return nil, invalid("Spec", fmt.Sprintf("%q: %v", spec, err))
	}
	ss, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, invalid("Spec", fmt.Sprintf("%q: not a cron spec", spec))
	}
	loc, err := loadZone(zone)
	if err != nil {
		return nil, err
	}
	c := &cronSpec{
		spec: spec, zone: zone, loc: loc,
		second: ss.Second, minute: ss.Minute, hour: ss.Hour,
		dom: ss.Dom, month: ss.Month, dow: ss.Dow,
	}
	c.never = !c.anyDate()
	return c, nil
}

// everyInstead says which cron spec to write for "@every d": the one
// naming the same wall-clock times when d divides a minute, an hour or a
// day, else an example.
func everyInstead(d string) string {
	v, err := time.ParseDuration(d)
	var spec string
	switch {
	case err != nil || v <= 0 || v%time.Second != 0:
	case v < time.Minute && time.Minute%v == 0:
		spec = fmt.Sprintf("*/%d * * * * *", v/time.Second)
	case v < time.Hour && v%time.Minute == 0 && time.Hour%v == 0:
		spec = fmt.Sprintf("0 */%d * * * *", v/time.Minute)
	case v < 24*time.Hour && v%time.Hour == 0 && 24*time.Hour%v == 0:
		spec = fmt.Sprintf("0 0 */%d * * *", v/time.Hour)
	}
	if spec == "" {
		return "write the times as a cron spec, e.g. \"*/10 * * * * *\" (every 10 seconds) or \"0 */5 * * * *\" (every 5 minutes)"
	}
	return fmt.Sprintf("write %q", spec)
}

// cronField is one field of a cron spec: its name in errors, its range,
// and the names it accepts (index = value), if any.
type cronField struct {
	name     string
	min, max int
	names    []string
}

var (
	secondField = cronField{name: "second", max: 59}
	cronFields  = []cronField{
		{name: "minute", max: 59},
		{name: "hour", max: 23},
		{name: "day of month", min: 1, max: 31},
		{name: "month", min: 1, max: 12, names: []string{"", "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}},
		{name: "day of week", max: 6, names: []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}},
	}
)

// checkFields returns what is wrong, naming the field, with a value that
// is not a number, a name the field accepts, nor in the field's range; ""
// when there is nothing of that kind (the parser checks the rest).
func checkFields(fields []string) string {
	all := cronFields
	switch len(fields) {
	case 5:
	case 6:
		all = append([]cronField{secondField}, cronFields...)
	default:
		return ""
	}
	for i, f := range fields {
		for _, item := range strings.Split(f, ",") {
			rng, step, _ := strings.Cut(item, "/")
			if step != "" && strings.Trim(step, "0123456789") != "" {
				return fmt.Sprintf("%s: step %q is not a number", all[i].name, step)
			}
			if rng == "*" || rng == "?" {
				continue
			}
			for _, v := range strings.Split(rng, "-") {
				if msg := all[i].check(v); msg != "" {
					return msg
				}
			}
		}
	}
	return ""
}

// check returns what is wrong with v as a bound in the field, or "".
func (c cronField) check(v string) string {
	if v == "" {
		return ""
	}
	if strings.Trim(v, "0123456789") == "" {
		if n, err := strconv.Atoi(v); err != nil || n < c.min || n > c.max {
			return fmt.Sprintf("%s: %s is out of range %d-%d", c.name, v, c.min, c.max)
		}
		return ""
	}
	if c.names == nil {
		return fmt.Sprintf("%s: %q is not a number (%d-%d)", c.name, v, c.min, c.max)
	}
	for _, n := range c.names {
		if n != "" && strings.EqualFold(n, v) {
			return ""
		}
	}
	kind := "month"
	if c.name == "day of week" {
		kind = "day"
	}
	return fmt.Sprintf("%s: %q is not a %s name (%s, or %d-%d)", c.name, v, kind, strings.TrimSpace(strings.Join(c.names, " ")), c.min, c.max)
}

// loadZone returns the IANA zone named zone; "" and "Local" are refused.
func loadZone(zone string) (*time.Location, error) {
	switch zone {
	case "":
		return nil, invalid("Zone", "empty; name an IANA time zone such as \"UTC\" or \"Europe/Berlin\"")
	case "Local":
		return nil, invalid("Zone", "\"Local\" is the host's zone, which may differ between instances; name an IANA time zone")
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, invalid("Zone", fmt.Sprintf("%q: unknown time zone: %v", zone, err))
	}
	return loc, nil
}

// String returns the spec and zone as given, e.g. "0 9 * * * (Asia/Seoul)".
func (s *cronSpec) String() string { return s.spec + " (" + s.zone + ")" }

// next returns the first scheduled instant strictly after t, in UTC; the
// zero Time when there is none within 5 years (e.g. "0 0 30 2 *").
func (s *cronSpec) next(t time.Time) time.Time {
	return s.search(t, t.AddDate(searchYears, 0, 0))
}

// prev returns the last scheduled instant strictly before t, in UTC; the
// zero Time when there is none within 5 years. It looks back over windows
// doubling from a minute, so a spec's gaps cost a few searches each.
func (s *cronSpec) prev(t time.Time) time.Time {
	to := t.Add(-time.Nanosecond)
	oldest := t.AddDate(-searchYears, 0, 0)
	for w := time.Minute; ; w *= 2 {
		from := t.Add(-w)
		if from.Before(oldest) {
			from = oldest
		}
		var last time.Time
		for f := from; ; {
			batch, more := s.between(f, to, recordChunk)
			if len(batch) > 0 {
				last, f = batch[len(batch)-1], batch[len(batch)-1]
			}
			if !more {
				break
			}
		}
		if !last.IsZero() || from.Equal(oldest) {
			return last
		}
	}
}

// between returns the scheduled instants in (from, to], ascending, at most max
// (max <= 0: none); more reports whether further instants exist in the range.
func (s *cronSpec) between(from, to time.Time, max int) (instants []time.Time, more bool) {
	for t := from; ; {
		n := s.search(t, to)
		if n.IsZero() {
			return instants, false
		}
		if len(instants) >= max {
			return instants, true
		}
		instants = append(instants, n)
		t = n
	}
}

// search returns the first scheduled instant after t and not after limit,
// in UTC, or the zero Time.
//
// The instant of a wall-clock time (see instant) never decreases as the
// wall-clock time increases, so the answer is the instant of the first
// scheduled wall-clock time whose instant is after t. Every wall-clock time
// up to t's own has an instant not after t; so have, when t lies in the
// second pass of a repeated interval, the rest of that interval's times.
func (s *cronSpec) search(t, limit time.Time) time.Time {
	if s.never || !limit.After(t) {
		return time.Time{}
	}
	lt := t.In(s.loc)
	from := wall(lt).Add(time.Second)
	if end, ok := repeatEnd(lt); ok && from.Before(end) {
		from = end
	}
	// A day's margin covers any offset between the instant and the wall.
	wallLimit := wall(limit.In(s.loc)).AddDate(0, 0, 1)
	for {
		w := s.nextWall(from, wallLimit)
		if w.IsZero() {
			return time.Time{}
		}
		i := s.instant(w)
		if i.After(limit) {
			return time.Time{}
		}
		if i.After(t) {
			return i
		}
		from = w.Add(time.Second) // not reached by the argument above; kept safe
	}
}

// wall returns the wall-clock reading of l (whole seconds) as a UTC-coded
// civil time: wall-clock arithmetic in UTC has no transitions.
func wall(l time.Time) time.Time {
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
}

// offsetBefore returns the zone offset (seconds) in effect just before
// start, a transition in l's location.
func offsetBefore(start time.Time) int {
	_, off := start.Add(-time.Nanosecond).Zone()
	return off
}

// repeatEnd reports, when the zone period of l began by setting clocks
// back, the UTC-coded wall-clock time at which the repeated interval ends
// (the wall-clock reading just before the transition). Wall-clock times
// before it whose first occurrence precedes the transition ran then.
func repeatEnd(l time.Time) (time.Time, bool) {
	start, _ := l.ZoneBounds()
	if start.IsZero() {
		return time.Time{}, false
	}
	before := offsetBefore(start)
	if _, after := l.Zone(); before <= after {
		return time.Time{}, false
	}
	return time.Unix(start.Unix()+int64(before), 0).UTC(), true
}

// instant returns, in UTC, the instant of the UTC-coded wall-clock time w in
// the zone: the earlier of two occurrences; for a time in a gap, the
// transition that ends the gap.
func (s *cronSpec) instant(w time.Time) time.Time {
	i := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), 0, s.loc)
	start, end := i.ZoneBounds()
	if got := wall(i); !got.Equal(w) {
		// w is in a gap; time.Date put i on one side of the transition.
		if got.After(w) && !start.IsZero() {
			return start.UTC()
		}
		if got.Before(w) && !end.IsZero() {
			return end.UTC()
		}
		return i.UTC()
	}
	if !start.IsZero() {
		before := offsetBefore(start)
		if _, after := i.Zone(); before > after {
			// i is after clocks were set back: w may have occurred before.
			e := i.Add(-time.Duration(before-after) * time.Second)
			if e.Before(start) && wall(e.In(s.loc)).Equal(w) {
				return e.UTC()
			}
		}
	}
	return i.UTC()
}

// nextWall returns the first UTC-coded wall-clock time at or after w (whole
// seconds) that the spec names, or the zero Time if there is none up to
// limit.
func (s *cronSpec) nextWall(w, limit time.Time) time.Time {
	for !w.After(limit) {
		y, mo, d := w.Date()
		h, mi, sec := w.Clock()
		switch {
		case 1<<uint(mo)&s.month == 0:
			w = time.Date(y, mo+1, 1, 0, 0, 0, 0, time.UTC)
		case !s.dayMatches(d, w.Weekday()):
			w = time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC)
		case 1<<uint(h)&s.hour == 0:
			w = time.Date(y, mo, d, h+1, 0, 0, 0, time.UTC)
		case 1<<uint(mi)&s.minute == 0:
			w = time.Date(y, mo, d, h, mi+1, 0, 0, time.UTC)
		case 1<<uint(sec)&s.second == 0:
			w = w.Add(time.Second)
		default:
			return w
		}
	}
	return time.Time{}
}

// dayMatches reports whether day-of-month d with weekday wd is named: both
// day fields must match when either is "*", one suffices otherwise.
func (s *cronSpec) dayMatches(d int, wd time.Weekday) bool {
	domMatch := 1<<uint(d)&s.dom != 0
	dowMatch := 1<<uint(wd)&s.dow != 0
	if s.dom&starBit != 0 || s.dow&starBit != 0 {
		return domMatch && dowMatch
	}
	return domMatch || dowMatch
}

// anyDate reports whether some calendar date matches the month and day
// fields. Only a day-of-month restricted alone can miss every date: each
// weekday occurs in every month.
func (s *cronSpec) anyDate() bool {
	if s.dom&starBit != 0 || s.dow&starBit == 0 {
		return true
	}
	days := [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for mo := 1; mo <= 12; mo++ {
		if 1<<uint(mo)&s.month == 0 {
			continue
		}
		for d := 1; d <= days[mo]; d++ {
			if 1<<uint(d)&s.dom != 0 {
				return true
			}
		}
	}
	return false
}
