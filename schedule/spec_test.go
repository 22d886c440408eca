package schedule

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

func mustSpec(t testing.TB, spec, zone string) *cronSpec {
	t.Helper()
	s, err := parseSpec(spec, zone)
	if err != nil {
		t.Fatalf("parseSpec(%q, %q): %v", spec, zone, err)
	}
	return s
}

func mustZone(t testing.TB, zone string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// utc parses "2006-01-02T15:04:05Z" or "2006-01-02T15:04Z".
func utc(t testing.TB, s string) time.Time {
	t.Helper()
	for _, layout := range []string{"2006-01-02T15:04:05Z", "2006-01-02T15:04Z"} {
		if v, err := time.Parse(layout, s); err == nil {
			return v
		}
	}
	t.Fatalf("bad time %q", s)
	return time.Time{}
}

// dayRange returns the wall-clock day (a UTC-coded civil date) and the range
// of instants (from, to] that covers it in loc with hours to spare.
func dayRange(t testing.TB, loc *time.Location, day string) (civil, from, to time.Time) {
	t.Helper()
	civil, err := time.Parse("2006-01-02", day)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(civil.Year(), civil.Month(), civil.Day(), 0, 0, 0, 0, loc)
	return civil, start.Add(-6 * time.Hour), start.Add(30 * time.Hour)
}

// onDay keeps the instants whose wall-clock date in loc is civil's, or
// which a wall-clock time of that date resolved to (the transition).
func onDay(ins []time.Time, loc *time.Location, civil time.Time) []time.Time {
	var out []time.Time
	for _, i := range ins {
		y, m, d := i.In(loc).Date()
		if y == civil.Year() && m == civil.Month() && d == civil.Day() {
			out = append(out, i)
		}
	}
	return out
}

// ruleOracle maps every wall-clock minute of civil's date in loc to its
// instant by the rule, found by scanning every UTC minute: the first
// instant whose wall-clock reading is that minute; for a minute no instant
// reads (a gap), the first instant reading later.
func ruleOracle(loc *time.Location, civil time.Time) map[time.Time]time.Time {
	start := civil.Add(-2 * 24 * time.Hour)
	var scan []time.Time
	for u := start; u.Before(civil.Add(3 * 24 * time.Hour)); u = u.Add(time.Minute) {
		scan = append(scan, u)
	}
	first := map[time.Time]time.Time{}
	for _, u := range scan {
		w := wall(u.In(loc))
		if _, ok := first[w]; !ok {
			first[w] = u
		}
	}
	out := map[time.Time]time.Time{}
	for w := civil; w.Before(civil.AddDate(0, 0, 1)); w = w.Add(time.Minute) {
		if u, ok := first[w]; ok {
			out[w] = u
			continue
		}
		for _, u := range scan {
			if wall(u.In(loc)).After(w) {
				out[w] = u
				break
			}
		}
	}
	return out
}

// checkInstants asserts that ins is strictly increasing and in UTC.
func checkInstants(t testing.TB, ins []time.Time) {
	t.Helper()
	for k, i := range ins {
		if i.Location() != time.UTC {
			t.Errorf("instant %d %v: location %v, want UTC", k, i, i.Location())
		}
		if k > 0 && !i.After(ins[k-1]) {
			t.Errorf("instants %d, %d not strictly increasing: %v, %v", k-1, k, ins[k-1], i)
		}
	}
}

func fmtUTC(ins []time.Time) []string {
	out := make([]string, len(ins))
	for k, i := range ins {
		out[k] = i.UTC().Format("2006-01-02T15:04Z")
	}
	return out
}

// The 2027 transitions used below:
//
//	Europe/Berlin    2027-03-28 02:00 CET  -> 03:00 CEST (01:00Z)
//	Europe/Berlin    2027-10-31 03:00 CEST -> 02:00 CET  (01:00Z)
//	America/New_York 2027-03-14 02:00 EST  -> 03:00 EDT  (07:00Z)
//	America/New_York 2027-11-07 02:00 EDT  -> 01:00 EST  (06:00Z)
func TestDSTDaily(t *testing.T) {
	cases := []struct {
		zone, day, spec string
		want            []string
	}{
		// Inside the gap: once, at the transition.
		{"Europe/Berlin", "2027-03-28", "30 2 * * *", []string{"2027-03-28T01:00Z"}},
		{"America/New_York", "2027-03-14", "30 2 * * *", []string{"2027-03-14T07:00Z"}},
		// The gap's time and the transition's own wall-clock time coalesce.
		{"Europe/Berlin", "2027-03-28", "30 2,3 * * *", []string{"2027-03-28T01:00Z", "2027-03-28T01:30Z"}},
		{"Europe/Berlin", "2027-03-28", "0 2,3 * * *", []string{"2027-03-28T01:00Z"}},
		// Inside the overlap: once, at the first occurrence.
		{"Europe/Berlin", "2027-10-31", "30 2 * * *", []string{"2027-10-31T00:30Z"}},
		{"America/New_York", "2027-11-07", "30 1 * * *", []string{"2027-11-07T05:30Z"}},
		// Outside the gap and the overlap: the day's offset.
		{"Europe/Berlin", "2027-03-28", "30 1 * * *", []string{"2027-03-28T00:30Z"}},
		{"Europe/Berlin", "2027-03-28", "30 4 * * *", []string{"2027-03-28T02:30Z"}},
		{"Europe/Berlin", "2027-10-31", "30 1 * * *", []string{"2027-10-30T23:30Z"}},
		{"Europe/Berlin", "2027-10-31", "30 3 * * *", []string{"2027-10-31T02:30Z"}},
		{"America/New_York", "2027-03-14", "30 1 * * *", []string{"2027-03-14T06:30Z"}},
		{"America/New_York", "2027-03-14", "0 9 * * *", []string{"2027-03-14T13:00Z"}},
		{"America/New_York", "2027-11-07", "30 2 * * *", []string{"2027-11-07T07:30Z"}},
		{"America/New_York", "2027-11-07", "0 9 * * *", []string{"2027-11-07T14:00Z"}},
		// The day before and after keep their own offsets.
		{"Europe/Berlin", "2027-03-27", "30 2 * * *", []string{"2027-03-27T01:30Z"}},
		{"Europe/Berlin", "2027-03-29", "30 2 * * *", []string{"2027-03-29T00:30Z"}},
	}
	for _, c := range cases {
		t.Run(c.zone+"/"+c.day+"/"+c.spec, func(t *testing.T) {
			s := mustSpec(t, c.spec, c.zone)
			loc := mustZone(t, c.zone)
			_, from, to := dayRange(t, loc, c.day)
			ins, more := s.between(from, to, 100)
			if more {
				t.Fatal("more = true with max 100")
			}
			checkInstants(t, ins)
			var got []time.Time
			for _, i := range ins {
				// Keep the instants of c.day's wall-clock times: wall
				// times of the day resolve to instants that read c.day.
				if i.In(loc).Format("2006-01-02") == c.day {
					got = append(got, i)
				}
			}
			if !slices.Equal(fmtUTC(got), c.want) {
				t.Errorf("instants on %s: %v, want %v", c.day, fmtUTC(got), c.want)
			}
			// next agrees with between, one step at a time.
			for k, i := range ins {
				prev := from
				if k > 0 {
					prev = ins[k-1]
				}
				if n := s.next(prev); !n.Equal(i) {
					t.Errorf("next(%v) = %v, want %v", prev, n, i)
				}
			}
		})
	}
}

func TestDSTHourly(t *testing.T) {
	berlinSpring := []string{
		"2027-03-27T23:00Z", // 00:00 CET
		"2027-03-28T00:00Z", // 01:00 CET
		"2027-03-28T01:00Z", // 02:00 (absent) and 03:00 CEST
		"2027-03-28T02:00Z", // 04:00 CEST
	}
	berlinFall := []string{
		"2027-10-30T22:00Z", // 00:00 CEST
		"2027-10-30T23:00Z", // 01:00 CEST
		"2027-10-31T00:00Z", // 02:00 CEST, first occurrence; 02:00 CET (01:00Z) does not run
		"2027-10-31T02:00Z", // 03:00 CET
	}
	nySpring := []string{
		"2027-03-14T05:00Z", // 00:00 EST
		"2027-03-14T06:00Z", // 01:00 EST
		"2027-03-14T07:00Z", // 02:00 (absent) and 03:00 EDT
		"2027-03-14T08:00Z", // 04:00 EDT
	}
	nyFall := []string{
		"2027-11-07T04:00Z", // 00:00 EDT
		"2027-11-07T05:00Z", // 01:00 EDT, first occurrence; 01:00 EST (06:00Z) does not run
		"2027-11-07T07:00Z", // 02:00 EST
		"2027-11-07T08:00Z", // 03:00 EST
	}
	cases := []struct {
		zone, day string
		want      []string // the first four of the day
		count     int      // instants of the day's wall-clock times
	}{
		{"Europe/Berlin", "2027-03-28", berlinSpring, 23},
		{"Europe/Berlin", "2027-10-31", berlinFall, 24},
		{"America/New_York", "2027-03-14", nySpring, 23},
		{"America/New_York", "2027-11-07", nyFall, 24},
	}
	for _, c := range cases {
		t.Run(c.zone+"/"+c.day, func(t *testing.T) {
			s := mustSpec(t, "0 * * * *", c.zone)
			loc := mustZone(t, c.zone)
			civil, from, to := dayRange(t, loc, c.day)
			ins, _ := s.between(from, to, 1000)
			checkInstants(t, ins)
			day := onDay(ins, loc, civil)
			if len(day) != c.count {
				t.Errorf("%d instants on %s, want %d: %v", len(day), c.day, c.count, fmtUTC(day))
			}
			if len(day) < 4 || !slices.Equal(fmtUTC(day[:4]), c.want) {
				t.Errorf("first instants on %s: %v, want %v", c.day, fmtUTC(day), c.want)
			}
		})
	}
}

// TestDSTPerMinute checks a per-minute spec over every 2027 transition of
// the zones (Australia/Lord_Howe shifts by 30 minutes) against the rule
// computed by brute force: the instants are exactly the images of the
// day's wall-clock minutes, each once, strictly increasing, in UTC.
func TestDSTPerMinute(t *testing.T) {
	cases := []struct {
		zone, day string
		count     int // instants of the day's 1440 wall-clock minutes
	}{
		{"Europe/Berlin", "2027-03-28", 1440 - 60},
		{"Europe/Berlin", "2027-10-31", 1440},
		{"America/New_York", "2027-03-14", 1440 - 60},
		{"America/New_York", "2027-11-07", 1440},
		{"Australia/Lord_Howe", "2027-04-04", 1440},
		{"Australia/Lord_Howe", "2027-10-03", 1440 - 30},
		{"Europe/Berlin", "2027-06-01", 1440},
	}
	for _, c := range cases {
		t.Run(c.zone+"/"+c.day, func(t *testing.T) {
			s := mustSpec(t, "* * * * *", c.zone)
			loc := mustZone(t, c.zone)
			civil, _, _ := dayRange(t, loc, c.day)
			oracle := ruleOracle(loc, civil)
			var want []time.Time
			for _, u := range oracle {
				want = append(want, u)
			}
			slices.SortFunc(want, time.Time.Compare)
			want = slices.CompactFunc(want, time.Time.Equal)
			if len(want) != c.count {
				t.Fatalf("oracle: %d instants, want %d", len(want), c.count)
			}
			from := want[0].Add(-time.Second)
			got, more := s.between(from, want[len(want)-1], 2000)
			if more {
				t.Fatal("more = true with max 2000")
			}
			checkInstants(t, got)
			if !slices.EqualFunc(got, want, time.Time.Equal) {
				t.Fatalf("between: %d instants, want %d; first difference at %v",
					len(got), len(want), firstDiff(got, want))
			}
			// Each wall-clock minute's instant is the next after the
			// instant just before it.
			for w, u := range oracle {
				if n := s.next(u.Add(-time.Nanosecond)); !n.Equal(u) {
					t.Errorf("wall %s: next(%v - 1ns) = %v", w.Format("15:04"), u, n)
				}
			}
		})
	}
}

func firstDiff(a, b []time.Time) string {
	for k := range min(len(a), len(b)) {
		if !a[k].Equal(b[k]) {
			return fmt.Sprintf("index %d: got %v, want %v", k, a[k], b[k])
		}
	}
	return "length"
}

// TestDSTSeconds runs the 6-field form across both Berlin transitions.
func TestDSTSeconds(t *testing.T) {
	s := mustSpec(t, "30 30 2 * * *", "Europe/Berlin")
	if got, want := s.next(utc(t, "2027-03-28T00:00Z")), utc(t, "2027-03-28T01:00Z"); !got.Equal(want) {
		t.Errorf("spring forward: next = %v, want %v", got, want)
	}
	if got, want := s.next(utc(t, "2027-10-31T00:00Z")), utc(t, "2027-10-31T00:30:30Z"); !got.Equal(want) {
		t.Errorf("fall back: next = %v, want %v", got, want)
	}
	if got, want := s.next(utc(t, "2027-10-31T00:30:30Z")), utc(t, "2027-11-01T01:30:30Z"); !got.Equal(want) {
		t.Errorf("after fall back: next = %v, want %v (02:30:30 CET does not run again)", got, want)
	}

	// Every 20 seconds through the spring-forward gap: the gap's 180
	// times coalesce with 03:00:00 into the transition.
	s = mustSpec(t, "*/20 * * * * *", "Europe/Berlin")
	ins, more := s.between(utc(t, "2027-03-28T00:59:00Z"), utc(t, "2027-03-28T01:01:00Z"), 100)
	checkInstants(t, ins)
	want := []string{"00:59:20", "00:59:40", "01:00:00", "01:00:20", "01:00:40", "01:01:00"}
	var got []string
	for _, i := range ins {
		got = append(got, i.Format("15:04:05"))
	}
	if more || !slices.Equal(got, want) {
		t.Errorf("between = %v (more %v), want %v", got, more, want)
	}
}

func TestSixFields(t *testing.T) {
	s := mustSpec(t, "15 30 9 * * *", "Asia/Seoul")
	if got, want := s.next(utc(t, "2027-01-10T00:00Z")), utc(t, "2027-01-10T00:30:15Z"); !got.Equal(want) {
		t.Errorf("next = %v, want %v", got, want)
	}
	s = mustSpec(t, "*/15 * * * * *", "UTC")
	ins, _ := s.between(utc(t, "2027-01-10T00:00:00Z"), utc(t, "2027-01-10T00:01:00Z"), 10)
	if got, want := fmtSec(ins), []string{"00:00:15", "00:00:30", "00:00:45", "00:01:00"}; !slices.Equal(got, want) {
		t.Errorf("between = %v, want %v", got, want)
	}
	// The 5-field form runs at second 0.
	s = mustSpec(t, "* * * * *", "UTC")
	if got, want := s.next(utc(t, "2027-01-10T00:00:01Z")), utc(t, "2027-01-10T00:01:00Z"); !got.Equal(want) {
		t.Errorf("next = %v, want %v", got, want)
	}
	// Sub-second input: strictly after.
	if got, want := s.next(utc(t, "2027-01-10T00:01:00Z").Add(-time.Nanosecond)), utc(t, "2027-01-10T00:01:00Z"); !got.Equal(want) {
		t.Errorf("next = %v, want %v", got, want)
	}
	if got, want := s.next(utc(t, "2027-01-10T00:01:00Z")), utc(t, "2027-01-10T00:02:00Z"); !got.Equal(want) {
		t.Errorf("next = %v, want %v", got, want)
	}
}

func fmtSec(ins []time.Time) []string {
	out := make([]string, len(ins))
	for k, i := range ins {
		out[k] = i.Format("15:04:05")
	}
	return out
}

func TestDescriptors(t *testing.T) {
	// 2027-05-12 is a Wednesday; New York is at -04:00 (EDT).
	from := utc(t, "2027-05-12T15:20Z")
	cases := []struct{ spec, want string }{
		{"@yearly", "2028-01-01T05:00Z"}, // EST in January
		{"@annually", "2028-01-01T05:00Z"},
		{"@monthly", "2027-06-01T04:00Z"},
		{"@weekly", "2027-05-16T04:00Z"}, // Sunday
		{"@daily", "2027-05-13T04:00Z"},
		{"@midnight", "2027-05-13T04:00Z"},
		{"@hourly", "2027-05-12T16:00Z"},
		{"0 0 * * SUN", "2027-05-16T04:00Z"},
		{"0 12 1 JAN-MAR *", "2028-01-01T17:00Z"},
		{"0 9 * * MON-FRI", "2027-05-13T13:00Z"},
		{"0 9 13,20 * MON", "2027-05-13T13:00Z"}, // dom or dow
		{"0 9 ? * MON", "2027-05-17T13:00Z"},
		{"0 0 29 2 *", "2028-02-29T05:00Z"},
	}
	for _, c := range cases {
		s := mustSpec(t, c.spec, "America/New_York")
		if got := s.next(from); !got.Equal(utc(t, c.want)) {
			t.Errorf("%s: next = %v, want %s", c.spec, got, c.want)
		}
	}
}

func TestBetweenCap(t *testing.T) {
	s := mustSpec(t, "0 * * * *", "Europe/Berlin")
	from, to := utc(t, "2027-05-12T00:00Z"), utc(t, "2027-05-12T10:00Z") // 10 instants in (from, to]
	cases := []struct {
		max   int
		count int
		more  bool
	}{
		{-1, 0, true}, {0, 0, true}, {1, 1, true}, {3, 3, true}, {9, 9, true}, {10, 10, false}, {11, 10, false},
	}
	for _, c := range cases {
		ins, more := s.between(from, to, c.max)
		if len(ins) != c.count || more != c.more {
			t.Errorf("max %d: %d instants, more %v; want %d, %v", c.max, len(ins), more, c.count, c.more)
		}
		checkInstants(t, ins)
		if len(ins) > 0 && !ins[0].Equal(utc(t, "2027-05-12T01:00Z")) {
			t.Errorf("max %d: first %v, want 01:00Z (from is excluded)", c.max, ins[0])
		}
		if c.count == 10 && !ins[9].Equal(to) {
			t.Errorf("max %d: last %v, want %v (to is included)", c.max, ins[9], to)
		}
	}
	for _, r := range [][2]time.Time{{to, to}, {to, from}, {from, from.Add(59 * time.Minute)}} {
		if ins, more := s.between(r[0], r[1], 10); len(ins) != 0 || more {
			t.Errorf("between(%v, %v) = %v, %v; want none", r[0], r[1], ins, more)
		}
	}
	// A range longer than next's 5-year bound.
	s = mustSpec(t, "0 0 1 1 *", "UTC")
	ins, more := s.between(utc(t, "2027-06-01T00:00Z"), utc(t, "2047-06-01T00:00Z"), 100)
	if len(ins) != 20 || more {
		t.Errorf("20 years of @yearly: %d instants, more %v", len(ins), more)
	}
}

func TestNextImpossible(t *testing.T) {
	from := utc(t, "2027-01-01T00:00Z")
	for _, spec := range []string{"0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 2 *"} {
		s := mustSpec(t, spec, "UTC")
		if n := s.next(from); !n.IsZero() {
			t.Errorf("%s: next = %v, want zero", spec, n)
		}
		if ins, more := s.between(from, from.AddDate(100, 0, 0), 10); len(ins) != 0 || more {
			t.Errorf("%s: between = %v, %v; want none", spec, ins, more)
		}
	}
	// February 29th: 2100 is no leap year, so after 2096 the next is 2104,
	// beyond next's 5 years; between still finds it.
	s := mustSpec(t, "0 0 29 2 *", "UTC")
	if n := s.next(utc(t, "2096-03-01T00:00Z")); !n.IsZero() {
		t.Errorf("next leap day after 2096: %v, want zero (2104 is beyond 5 years)", n)
	}
	if ins, _ := s.between(utc(t, "2096-03-01T00:00Z"), utc(t, "2105-01-01T00:00Z"), 10); len(ins) != 1 || !ins[0].Equal(utc(t, "2104-02-29T00:00Z")) {
		t.Errorf("between: %v, want [2104-02-29]", ins)
	}
	// The 30th of February or a Monday: every Monday of February.
	s = mustSpec(t, "0 0 30 2 MON", "UTC")
	if n, want := s.next(from), utc(t, "2027-02-01T00:00Z"); !n.Equal(want) {
		t.Errorf("dom or dow: next = %v, want %v", n, want)
	}
}

func TestParseSpecBadInput(t *testing.T) {
	cases := []struct {
		spec, zone, field string
	}{
		{"", "UTC", "Spec"},
		{"   ", "UTC", "Spec"},
		{"CRON_TZ=Europe/Berlin 0 9 * * *", "UTC", "Spec"},
		{"TZ=Europe/Berlin 0 9 * * *", "UTC", "Spec"},
		{"@every 1h", "UTC", "Spec"},
		{"@every", "UTC", "Spec"},
		{"@fortnightly", "UTC", "Spec"},
		{"60 * * * *", "UTC", "Spec"},
		{"* 24 * * *", "UTC", "Spec"},
		{"* * 0 * *", "UTC", "Spec"},
		{"* * 32 * *", "UTC", "Spec"},
		{"* * * 0 *", "UTC", "Spec"},
		{"* * * 13 *", "UTC", "Spec"},
		{"* * * * 7", "UTC", "Spec"},
		{"60 * * * * *", "UTC", "Spec"},
		{"-1 * * * *", "UTC", "Spec"},
		{"*/0 * * * *", "UTC", "Spec"},
		{"5-3 * * * *", "UTC", "Spec"},
		{"1,,2 * * * *", "UTC", "Spec"},
		{",1 * * * *", "UTC", "Spec"},
		{"0 9 1, * *", "UTC", "Spec"},
		{"99999999999999999999 * * * *", "UTC", "Spec"},
		{"* * * *", "UTC", "Spec"},
		{"* * * * * * *", "UTC", "Spec"},
		{"a b c d e", "UTC", "Spec"},
		{"* * * FOO *", "UTC", "Spec"},
		{"0 9 * * *", "", "Zone"},
		{"0 9 * * *", "Local", "Zone"},
		{"0 9 * * *", "Mars/Olympus_Mons", "Zone"},
		{"0 9 * * *", " UTC", "Zone"},
		{"0 9 * * *", "../../etc/passwd", "Zone"},
		{"0 9 * * *", "/etc/localtime", "Zone"},
		{"0 9 * * *", "+02:00", "Zone"},
	}
	for _, c := range cases {
		s, err := parseSpec(c.spec, c.zone)
		if err == nil {
			t.Errorf("parseSpec(%q, %q) = %v, want an error", c.spec, c.zone, s)
			continue
		}
		if s != nil {
			t.Errorf("parseSpec(%q, %q): non-nil spec with error %v", c.spec, c.zone, err)
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("parseSpec(%q, %q): %v does not wrap ErrInvalid", c.spec, c.zone, err)
		}
		if prefix := "schedule: " + c.field + ": "; !strings.HasPrefix(err.Error(), prefix) {
			t.Errorf("parseSpec(%q, %q): %q does not start with %q", c.spec, c.zone, err, prefix)
		}
	}
}

func TestString(t *testing.T) {
	s := mustSpec(t, "0 9 * * *", "Asia/Seoul")
	if got, want := s.String(), "0 9 * * * (Asia/Seoul)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if s := mustSpec(t, "@daily", "UTC"); s.String() != "@daily (UTC)" {
		t.Errorf("String() = %q", s.String())
	}
}

// TestFarZones: a schedule's instants depend on its zone only, not on the
// host's zone (run the package with TZ=Pacific/Kiritimati too) nor on the
// location of the time given.
func TestFarZones(t *testing.T) {
	cases := []struct{ zone, want string }{
		{"Pacific/Kiritimati", "2027-01-09T19:00Z"}, // +14:00
		{"Pacific/Pago_Pago", "2027-01-09T20:00Z"},  // -11:00
		{"Asia/Kathmandu", "2027-01-10T03:15Z"},     // +05:45
		{"America/St_Johns", "2027-01-09T12:30Z"},   // -03:30
		{"UTC", "2027-01-10T09:00Z"},
	}
	from := utc(t, "2027-01-09T12:00Z")
	for _, c := range cases {
		s := mustSpec(t, "0 9 * * *", c.zone)
		for _, in := range []time.Time{from, from.Local(), from.In(mustZone(t, "Pacific/Kiritimati")), from.In(mustZone(t, "Pacific/Pago_Pago"))} {
			got := s.next(in)
			if !got.Equal(utc(t, c.want)) || got.Location() != time.UTC {
				t.Errorf("%s: next(%v) = %v, want %s in UTC (host zone %v)", c.zone, in, got, c.want, time.Local)
			}
		}
	}
}

// randSet returns a random non-empty subset of [lo, hi], or nil for "*".
func randSet(r *rand.Rand, lo, hi int, star float64) []int {
	if r.Float64() < star {
		return nil
	}
	var out []int
	for len(out) == 0 {
		p := r.Float64()
		for v := lo; v <= hi; v++ {
			if r.Float64() < p*p {
				out = append(out, v)
			}
		}
	}
	return out
}

func field(vals []int) string {
	if vals == nil {
		return "*"
	}
	s := make([]string, len(vals))
	for k, v := range vals {
		s[k] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func in(vals []int, v int) bool { return vals == nil || slices.Contains(vals, v) }

// TestNextProperty compares next, for random specs and times in zones
// without daylight saving time, against a scan of every minute, and
// against robfig/cron's Next (exact where no transition occurs).
func TestNextProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	zones := []string{"UTC", "Asia/Kolkata", "Asia/Kathmandu", "Pacific/Kiritimati", "America/Phoenix"}
	n := 300
	if testing.Short() {
		n = 50
	}
	for range n {
		zone := zones[r.IntN(len(zones))]
		loc := mustZone(t, zone)
		mins := randSet(r, 0, 59, 0.3)
		hours := randSet(r, 0, 23, 0.5)
		doms := randSet(r, 1, 31, 0.7)
		months := randSet(r, 1, 12, 0.8)
		dows := randSet(r, 0, 6, 0.7)
		spec := strings.Join([]string{field(mins), field(hours), field(doms), field(months), field(dows)}, " ")
		s := mustSpec(t, spec, zone)
		from := time.Unix(1798761600+r.Int64N(3*365*86400), r.Int64N(2e9)) // 2027..2030

		dayOK := func(l time.Time) bool {
			dm, wm := in(doms, l.Day()), in(dows, int(l.Weekday()))
			if doms != nil && dows != nil {
				return dm || wm
			}
			return dm && wm
		}
		var want time.Time
		u := from.Truncate(time.Minute).Add(time.Minute)
		for end := from.AddDate(1, 0, 0); u.Before(end); u = u.Add(time.Minute) {
			l := u.In(loc)
			if !in(months, int(l.Month())) || !dayOK(l) {
				u = time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc).Add(-time.Minute)
				continue
			}
			if in(hours, l.Hour()) && in(mins, l.Minute()) {
				want = u
				break
			}
		}
		if want.IsZero() {
			continue // none within the scan's year; the impossible case is tested elsewhere
		}
		if got := s.next(from); !got.Equal(want) {
			t.Fatalf("%q in %s: next(%v) = %v, want %v", spec, zone, from, got, want)
		}
		rs, err := cron.ParseStandard(spec)
		if err != nil {
			t.Fatal(err)
		}
		rs.(*cron.SpecSchedule).Location = loc
		if got := s.next(from); !got.Equal(rs.Next(from)) {
			t.Fatalf("%q in %s: next(%v) = %v, robfig %v", spec, zone, from, got, rs.Next(from))
		}
	}
}

// FuzzParseSpec: any input either parses or fails with ErrInvalid naming
// Spec or Zone, never panics; a parsed spec's next is after its input, in
// UTC, or zero.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"0 9 * * *", "*/5 1-3 * JAN-MAR MON", "@weekly", "30 */7 2 29 2 *", "0 0 30 2 *", "CRON_TZ=UTC * * * * *", "@every 1s", "1-60/0"} {
		f.Add(s, "Europe/Berlin", int64(1806278400))
	}
	f.Add("* * * * *", "Australia/Lord_Howe", int64(1822579200))
	f.Add("0 9 * * *", "Local", int64(0))
	f.Fuzz(func(t *testing.T, spec, zone string, sec int64) {
		s, err := parseSpec(spec, zone)
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, ErrInvalid) || !(strings.HasPrefix(msg, "schedule: Spec: ") || strings.HasPrefix(msg, "schedule: Zone: ")) {
				t.Fatalf("parseSpec(%q, %q): %v", spec, zone, err)
			}
			return
		}
		from := time.Unix(sec%(200*365*86400), 0)
		n := s.next(from)
		if !n.IsZero() && (!n.After(from) || n.Location() != time.UTC) {
			t.Fatalf("%v: next(%v) = %v", s, from, n)
		}
		ins, _ := s.between(from, from.Add(48*time.Hour), 5)
		if len(ins) > 0 && !ins[0].Equal(n) {
			t.Fatalf("%v: between starts %v, next %v", s, ins[0], n)
		}
		checkInstants(t, ins)
	})
}

// TestDSTProperty compares between and next, for random specs over the
// days around 2027's transitions, against the rule computed by brute force
// (ruleOracle): the instants are the images of the scheduled wall-clock
// minutes, each once.
func TestDSTProperty(t *testing.T) {
	days := []struct{ zone, day string }{
		{"Europe/Berlin", "2027-03-28"}, {"Europe/Berlin", "2027-10-31"},
		{"America/New_York", "2027-03-14"}, {"America/New_York", "2027-11-07"},
		{"Australia/Lord_Howe", "2027-04-04"}, {"Australia/Lord_Howe", "2027-10-03"},
		{"Pacific/Chatham", "2027-04-04"}, {"Pacific/Chatham", "2027-09-26"},
	}
	r := rand.New(rand.NewPCG(3, 4))
	n := 8
	if testing.Short() {
		n = 2
	}
	for _, d := range days {
		loc := mustZone(t, d.zone)
		civil, _, _ := dayRange(t, loc, d.day)
		oracle := ruleOracle(loc, civil)
		for range n {
			mins := randSet(r, 0, 59, 0.2)
			hours := randSet(r, 0, 23, 0.3)
			spec := field(mins) + " " + field(hours) + " * * *"
			s := mustSpec(t, spec, d.zone)
			var want []time.Time
			for w, u := range oracle {
				if in(mins, w.Minute()) && in(hours, w.Hour()) {
					want = append(want, u)
				}
			}
			slices.SortFunc(want, time.Time.Compare)
			want = slices.CompactFunc(want, time.Time.Equal)
			// The day's wall-clock times map into (lo, hi].
			lo := oracle[civil].Add(-time.Second)
			hi := oracle[civil.Add(24*time.Hour-time.Minute)]
			got, _ := s.between(lo, hi, 2000)
			checkInstants(t, got)
			if !slices.EqualFunc(got, want, time.Time.Equal) {
				t.Fatalf("%q in %s on %s: between %v, want %v", spec, d.zone, d.day, fmtSec(got), fmtSec(want))
			}
			for range 20 {
				from := lo.Add(time.Duration(r.Int64N(int64(hi.Sub(lo)))))
				k, _ := slices.BinarySearchFunc(want, from, func(a, b time.Time) int {
					if !a.After(b) {
						return -1
					}
					return 1
				})
				if k == len(want) {
					continue
				}
				if got := s.next(from); !got.Equal(want[k]) {
					t.Fatalf("%q in %s: next(%v) = %v, want %v", spec, d.zone, from, got, want[k])
				}
			}
		}
	}
}

// prev is next's inverse: for every instant i of a spec, prev of the
// instant after it is i, across DST transitions, sparse and dense specs;
// a spec with no instant within 5 years has no prev either.
func TestPrev(t *testing.T) {
	t.Parallel()
	cases := []struct{ spec, zone string }{
		{"0 9 * * *", "Asia/Seoul"},
		{"30 2 * * *", "Europe/Berlin"},     // inside the spring gap and the repeated hour
		{"*/7 * * * *", "America/New_York"}, // dense
		{"0 0 1 1 *", "UTC"},                // yearly: a long look back
		{"* * 1 * *", "UTC"},                // a burst, then a month's gap
	}
	for _, c := range cases {
		s := mustSpec(t, c.spec, c.zone)
		t0 := time.Date(2027, 3, 20, 0, 0, 0, 0, time.UTC)
		instants, _ := s.between(t0, t0.AddDate(0, 0, 40), 3000)
		if len(instants) < 2 {
			instants, _ = s.between(t0, t0.AddDate(3, 0, 0), 3)
		}
		for k, i := range instants[1:] {
			if p := s.prev(i); !p.Equal(instants[k]) {
				t.Fatalf("%s: prev(%s) = %s, want %s", s, i, p, instants[k])
			}
			if p := s.prev(i.Add(-time.Millisecond)); !p.Equal(instants[k]) {
				t.Fatalf("%s: prev(%s) = %s, want %s", s, i.Add(-time.Millisecond), p, instants[k])
			}
		}
	}
	if p := mustSpec(t, "0 0 30 2 *", "UTC").prev(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)); !p.IsZero() {
		t.Fatalf("prev of an impossible spec: %s", p)
	}
}

// TestSpecErrorsSayWhatToWrite: @every is refused with the cron spec to
// write instead, a misspelled day or month name names the field and the
// names allowed, and a spec that never fires is refused at Register
// naming Definition.Spec.
func TestSpecErrorsSayWhatToWrite(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"@every 10s", `"*/10 * * * * *"`},
		{"@every 5m", `"0 */5 * * * *"`},
		{"@every 2h", `"0 0 */2 * * *"`},
		{"@every 7s", `"*/10 * * * * *"`},
		{"@every", `"*/10 * * * * *"`},
		{"0 9 * * MON-FRU", "day of week: \"FRU\" is not a day name (SUN MON TUE WED THU FRI SAT, or 0-6)"},
		{"0 9 * * mon,tues", "day of week: \"tues\" is not a day name"},
		{"0 0 9 * * MON-FRU", "day of week: \"FRU\""},
		{"0 9 1 JANN *", "month: \"JANN\" is not a month name (JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC, or 1-12)"},
		{"0 9 1 JAN-DEX/2 *", "month: \"DEX\""},
		{"0 x * * *", "hour: \"x\" is not a number"},
	} {
		_, err := parseSpec(c.spec, "UTC")
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: Spec: ") ||
			!strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "strconv") {
			t.Errorf("parseSpec(%q): %v; want a Spec error containing %s", c.spec, err, c.want)
		}
	}
	for _, spec := range []string{"0 9 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"} {
		d := Definition{Name: "x", Spec: spec, Version: 1}
		_, _, err := d.normalize()
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "schedule: Definition.Spec: ") ||
			!strings.Contains(err.Error(), "no instant in the next 5 years") {
			t.Errorf("normalize(%q): %v; want a Definition.Spec error saying it never fires", spec, err)
		}
	}
	for _, spec := range []string{"0 0 29 2 *", "0 0 30 2 MON", "0 9 * * MON-FRI", "0 9 1 jan-dec/2 *", "0 0 9 * * sun"} {
		d := Definition{Name: "x", Spec: spec, Version: 1}
		if _, _, err := d.normalize(); err != nil {
			t.Errorf("normalize(%q): %v", spec, err)
		}
	}
}
