package chaos

// What a run found: its checks, and the faults it injected and where they
// landed.

import (
	"sync"
	"time"
)

// Result is the outcome of a run.
type Result struct {
	Seed     int64         // the seed the run used (to replay it)
	Config   Config        // the configuration, defaults filled in
	Faults   []FaultCount  // faults injected, by kind
	Checks   []Check       // every invariant checked
	Stats    []Stat        // figures of the workload
	Dir      string        // where the logs are (kept when there were violations)
	Duration time.Duration // how long the whole run took
}

// FaultCount is how many faults of one kind were injected.
type FaultCount struct {
	Kind   Fault
	Count  int    // how many were injected (for FaultBouncer: instances behind it)
	Detail string // e.g. how many landed mid-batch
}

// Violations is the number of violations over all checks.
func (r *Result) Violations() int {
	n := 0
	for _, c := range r.Checks {
		n += c.Violations
	}
	return n
}

// Check returns the check called name, or nil.
func (r *Result) Check(name string) *Check {
	for i := range r.Checks {
		if r.Checks[i].Name == name {
			return &r.Checks[i]
		}
	}
	return nil
}

// faultLog counts injected faults.
type faultLog struct {
	mu         sync.Mutex
	n          map[Fault]int
	midBatch   map[Fault]int // FaultSchedule: mid-run
	terminated int
	offsets    []int64
	kills      []hit
	stops      []stop
	restarts   []time.Time
	paused     map[string]bool // schedules paused now
}

// stop is a SIGSTOP and when its SIGCONT came (zero: never).
type stop struct {
	hit
	to time.Time
}

// resumed records the SIGCONT of holder's open stop.
func (f *faultLog) resumed(holder string, at time.Time) {
	if at.IsZero() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.stops {
		if f.stops[i].holder == holder && f.stops[i].to.IsZero() {
			f.stops[i].to = at
		}
	}
}

func (f *faultLog) midRun(hits []hit) int {
	n := 0
	for _, h := range hits {
		if h.midRun {
			n++
		}
	}
	return n
}

func (f *faultLog) add(k Fault, mid bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[k]++
	if mid {
		f.midBatch[k]++
	}
}
