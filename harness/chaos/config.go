package chaos

// The harness's configuration: the faults it injects and what a run sets
// up.

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
)

// Fault is a kind of fault the harness injects.
type Fault string

// AllFaults lists every fault kind, in report order.
var AllFaults = []Fault{FaultKill, FaultTerminate, FaultRestart, FaultClock, FaultPause, FaultSchedule, FaultBouncer, FaultExhaust}

// ParseFaults parses a comma-separated list of fault kinds (of AllFaults
// and PatroniFaults); "all" and "" mean AllFaults, "none" means none.
func ParseFaults(s string) ([]Fault, error) {
	switch strings.TrimSpace(s) {
	case "", "all":
		return slices.Clone(AllFaults), nil
	case "none":
		return nil, nil
	}
	var out []Fault
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(AllFaults, Fault(f)) && !slices.Contains(PatroniFaults, Fault(f)) {
			return nil, fmt.Errorf("chaos: unknown fault %q (known: %v, and with Patroni %v)", f, AllFaults, PatroniFaults)
		}
		if !slices.Contains(out, Fault(f)) {
			out = append(out, Fault(f))
		}
	}
	return out, nil
}

// Config configures a run. The zero value (with Duration set) is the
// default short run.
type Config struct {
	// Seed drives the fault schedule and the workload's failures. 0 picks
	// one at random; the chosen seed is in the Result and the report.
	Seed int64
	// Duration is how long faults are injected. Required.
	Duration time.Duration
	// Instances is the number of instance processes (default 4).
	Instances int
	// Bouncer is how many of them reach Postgres through PgBouncer when
	// FaultBouncer is on (default Instances/2).
	Bouncer int
	// Faults enabled (default AllFaults; with Patroni, PatroniFaults). Nil
	// means the default; use ParseFaults ("none") for a run without faults.
	// PatroniFaults need Patroni; restart and bouncer are not modelled with
	// it.
	Faults []Fault
	// NoFaults runs without any fault (Faults is ignored).
	NoFaults bool
	// FaultEvery is the mean time between faults (default 1.5s); for the
	// Patroni faults, the mean pause between the cluster being whole again
	// and the next one.
	FaultEvery time.Duration
	// RowsPerSecond is the rate at which new PAUSED rows arrive (default 40).
	RowsPerSecond int
	// Broken selects a deliberately broken worker (BrokenNoFence,
	// BrokenNoGuard, BrokenNoLedger); "" is the real one.
	Broken string
	// Schedules is the number of one-period schedules per group (default
	// 50): every instance runs the advisory group's (direct instances) or
	// the lease group's (every instance, when some are behind PgBouncer).
	Schedules int
	// Period is the schedules' period, whole seconds dividing a minute
	// (default 1s).
	Period time.Duration
	// Window is the schedules' catch-up window (default 1m): longer than
	// the longest a schedule falls behind in a run, its database stalls
	// (a restart, an exhausted server, 10 s and more on a loaded 2-core
	// machine) plus the backlog's drain, so that an instant due during a
	// fault runs rather than being skipped as missed. The run prints the
	// start lags ("schedule start lag").
	Window time.Duration
	// MaxOffset bounds the injected clock offsets (default 5s).
	MaxOffset time.Duration
	// Executable is the binary started for each instance; it must call
	// MaybeWorker first thing. Default: this process's own executable.
	Executable string
	// Dir receives the instances' logs. Default: a temporary directory,
	// removed after a run without violations.
	Dir string
	// Out receives progress lines (default: discarded).
	Out io.Writer
	// Patroni runs the database as a Patroni cluster (etcd and two
	// PostgreSQL nodes on loopback, see docs/RELIABILITY.md) instead of one
	// server; the instances connect through a multi-host URL with
	// target_session_attrs=read-write and nobody goes through PgBouncer.
	// Needs patroni, patronictl and etcd (ErrNoPatroni).
	Patroni bool
	// Sync turns Patroni's synchronous_mode on (patronictl edit-config)
	// before the faults; false is asynchronous replication. Needs Patroni.
	Sync bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Duration <= 0 {
		return c, errors.New("chaos: Config.Duration: must be positive")
	}
	if c.Seed == 0 {
		c.Seed = rand.Int64N(1<<53) + 1
	}
	if c.Instances == 0 {
		c.Instances = 4
	}
	if c.Instances < 2 {
		return c, errors.New("chaos: Config.Instances: need at least 2")
	}
	if c.NoFaults {
		c.Faults = []Fault{}
	} else if c.Faults == nil && c.Patroni {
		c.Faults = slices.Clone(PatroniFaults)
	} else if c.Faults == nil {
		c.Faults = slices.Clone(AllFaults)
	}
	if c.Sync && !c.Patroni {
		return c, errors.New("chaos: Config.Sync: synchronous_mode needs Config.Patroni")
	}
	for _, f := range c.Faults {
		switch {
		case c.Patroni && (f == FaultRestart || f == FaultBouncer):
			return c, fmt.Errorf("chaos: Config.Faults: %q is not modelled with Config.Patroni (Patroni restarts its own servers; no PgBouncer in that topology)", f)
		case !c.Patroni && slices.Contains(PatroniFaults, f):
			return c, fmt.Errorf("chaos: Config.Faults: %q needs Config.Patroni", f)
		}
	}
	if slices.Contains(c.Faults, FaultBouncer) {
		if c.Bouncer == 0 {
			c.Bouncer = c.Instances / 2
		}
		if c.Bouncer < 0 || c.Bouncer > c.Instances {
			return c, errors.New("chaos: Config.Bouncer: out of range")
		}
	} else {
		c.Bouncer = 0
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 1500 * time.Millisecond
	}
	if c.RowsPerSecond == 0 {
		c.RowsPerSecond = 40
	}
	if c.Broken != "" && !slices.Contains(brokenModes, c.Broken) {
		return c, fmt.Errorf("chaos: Config.Broken: unknown mode %q (known: %v)", c.Broken, brokenModes)
	}
	if c.Schedules == 0 {
		c.Schedules = 50
	}
	if c.Schedules < 0 {
		return c, errors.New("chaos: Config.Schedules: must not be negative")
	}
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.Period < time.Second || c.Period%time.Second != 0 || time.Minute%c.Period != 0 {
		return c, errors.New("chaos: Config.Period: must be whole seconds dividing a minute")
	}
	if c.Window == 0 {
		c.Window = time.Minute
	}
	if c.MaxOffset == 0 {
		c.MaxOffset = 5 * time.Second
	}
	if c.Window < 2*c.MaxOffset+4*c.Period {
		return c, errors.New("chaos: Config.Window: must exceed 2*MaxOffset + 4*Period")
	}
	if c.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return c, err
		}
		c.Executable = exe
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c, nil
}

// timing of the workload, derived from the Config.
func (c Config) worker() workerConfig {
	return workerConfig{
		Broken:         c.Broken,
		Period:         c.Period,
		Window:         c.Window,
		Schedules:      c.Schedules,
		SchedWork:      100 * time.Millisecond,
		SchedLease:     2 * time.Second,
		SchedPoll:      time.Second,
		SchedAttempts:  10,
		PollEvery:      200 * time.Millisecond,
		BatchSize:      20,
		WorkPerRow:     10 * time.Millisecond,
		RowLease:       2 * time.Second,
		SweepEvery:     time.Second,
		MaxAttempts:    3,
		ElectorTTL:     2 * time.Second,
		HeartbeatEvery: 250 * time.Millisecond,
		FailPermille:   5,
		RetryPermille:  10,
		Seed:           c.Seed,
	}
}

// pauseRange is how long a SIGSTOP lasts: always longer than the row lease,
// the schedules' lease and the elector's TTL, so the paused instance wakes
// up as a zombie whose claims, runs and locks were taken over.
func (c Config) pauseRange() (lo, hi time.Duration) {
	w := c.worker()
	longest := max(w.RowLease, w.SchedLease, w.ElectorTTL)
	return longest + w.SweepEvery + 500*time.Millisecond, longest + 4*time.Second
}

// schedGroups are the schedule groups an instance runs: the advisory group
// when it is direct, the lease group when some instance is behind
// PgBouncer.
func (c Config) schedGroups(bouncer bool) []string {
	var gs []string
	if !bouncer {
		gs = append(gs, schedGroupAdv)
	}
	if c.Bouncer > 0 {
		gs = append(gs, schedGroupLease)
	}
	return gs
}

// scheduleNames lists every schedule of the run.
func (c Config) scheduleNames() []string {
	var names []string
	for _, g := range c.schedGroups(false) {
		if g == schedGroupAdv && c.Bouncer == c.Instances {
			continue
		}
		for i := 0; i < c.Schedules; i++ {
			names = append(names, schedName(g, i))
		}
	}
	return names
}

func patroniNote(c Config) string {
	switch {
	case c.Patroni && c.Sync:
		return ", Patroni (2 nodes, synchronous_mode on)"
	case c.Patroni:
		return ", Patroni (2 nodes, asynchronous)"
	}
	return ""
}

func brokenNote(b string) string {
	if b == "" {
		return ""
	}
	return ", deliberately broken worker: " + b
}
