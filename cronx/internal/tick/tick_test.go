package tick

import (
	"errors"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/gate"
)

// every is a calendar of instants every d since the Unix epoch.
type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	return t.Truncate(d).Add(d)
}

// interval counts d from t, like robfig/cron's "@every".
type interval time.Duration

func (i interval) Next(t time.Time) time.Time { return t.Add(time.Duration(i)) }

// stuck returns the same instant forever.
type stuck struct{ at time.Time }

func (s stuck) Next(time.Time) time.Time { return s.at }

// none has no instants.
type none struct{}

func (none) Next(time.Time) time.Time { return time.Time{} }

func TestLatest(t *testing.T) {
	base := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name     string
		sched    gate.Schedule
		now      time.Time
		maxDelay time.Duration
		want     time.Time // zero: ErrNoInstant
	}{
		{"on the instant", every(time.Second), base, time.Minute, base},
		{"late", every(time.Second), base.Add(300 * time.Millisecond), time.Minute, base},
		{"almost a period late", every(time.Second), base.Add(999 * time.Millisecond), time.Minute, base},
		{"sparse", every(24 * time.Hour), base.Truncate(24 * time.Hour).Add(1500 * time.Millisecond), time.Minute, base.Truncate(24 * time.Hour)},
		{"dense", every(time.Millisecond), base.Add(1500 * time.Microsecond), time.Minute, base.Add(time.Millisecond)},
		{"later than MaxDelay", every(time.Hour), base.Add(2 * time.Minute), time.Minute, time.Time{}},
		{"exactly MaxDelay late", every(time.Hour), base.Add(time.Minute), time.Minute, time.Time{}},
		{"just under MaxDelay late", every(time.Hour), base.Add(time.Minute - time.Nanosecond), time.Minute, base},
		{"huge MaxDelay", every(time.Hour), base.Add(30 * time.Minute), 1 << 62, base},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Latest(c.sched, c.now, c.maxDelay)
			if c.want.IsZero() {
				if !errors.Is(err, ErrNoInstant) {
					t.Fatalf("got %v, %v; want ErrNoInstant", got, err)
				}
				return
			}
			if err != nil || !got.Equal(c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestLatestNotAdvancing(t *testing.T) {
	now := time.Date(2026, 11, 30, 9, 0, 1, 0, time.UTC)
	_, err := Latest(stuck{now.Add(-time.Second)}, now, time.Minute)
	if err == nil || errors.Is(err, ErrNoInstant) {
		t.Fatalf("got %v, want an error about a schedule that does not advance", err)
	}
}

// Every instance computes the same instant whatever its clock offset, as
// long as it fires when its own clock reaches the instant.
func TestLatestSkew(t *testing.T) {
	sched := every(time.Second)
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for _, delay := range []time.Duration{0, time.Microsecond, 10 * time.Millisecond, 900 * time.Millisecond} {
		got, err := Latest(sched, at.Add(delay), time.Minute)
		if err != nil || !got.Equal(at) {
			t.Errorf("fired %v late: got %v, %v; want %v", delay, got, err, at)
		}
	}
}

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 30, 9, 0, 0, 123, time.UTC)
	if d, err := Check("x", "job", every(time.Second), 0, 3*time.Minute, now); err != nil || d != 3*time.Minute {
		t.Fatalf("defaults: got %v, %v; want the fallback, %v", d, err, 3*time.Minute)
	}
	if d, err := Check("x", "job", every(time.Second), 5*time.Second, 3*time.Minute, now); err != nil || d != 5*time.Second {
		t.Fatalf("MaxDelay: got %v, %v", d, err)
	}
	bad := []struct {
		name     string
		job      string
		sched    gate.Schedule
		maxDelay time.Duration
		msg      string
	}{
		{"empty name", "", every(time.Second), 0, "x: name: must not be empty"},
		{"nil sched", "job", nil, 0, "x: sched: must not be nil"},
		{"negative delay", "job", every(time.Second), -1, "x: MaxDelay: must not be negative"},
		{"interval", "job", interval(90 * time.Second), 0, "x: sched: instants are not fixed in time"},
		{"no instant", "job", none{}, 0, "x: sched: has no instant after now"},
		{"going back", "job", stuck{now.Add(-time.Hour)}, 0, "x: sched: Next(now) is not after now"},
	}
	for _, c := range bad {
		_, err := Check("x", c.job, c.sched, c.maxDelay, time.Minute, now)
		if !errors.Is(err, gate.ErrInvalid) || len(err.Error()) < len(c.msg) || err.Error()[:len(c.msg)] != c.msg {
			t.Errorf("%s: got %v, want gate.ErrInvalid starting %q", c.name, err, c.msg)
		}
	}
}
