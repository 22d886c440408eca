package main

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// An instance reports to the demo's orchestrator with one JSON object per
// line on its standard output. These are the kinds of events.
const (
	evReady      = "ready"       // migrated and swept at start-up; Holder, PID, Msg (migrations applied)
	evSwept      = "swept"       // a sweep moved rows; Rule, N, To, By
	evCatchUp    = "catch-up"    // start-up catch-up of a missed tick; Msg
	evCampaign   = "campaigning" // joined the election
	evElected    = "elected"     // became leader; Fence is the term's fence
	evDemoted    = "demoted"     // leadership ended; Msg
	evFired      = "tick-fired"  // the schedule fired; FireAt
	evTickRun    = "tick-run"    // this instance won the tick; FireAt, Fence
	evTickSkip   = "tick-skipped"
	evTickDone   = "tick-done" // the tick's run returned; Msg is the error, if any
	evSending    = "sending"   // work on one push began; ID, Fence
	evResumed    = "resumed"   // a resume run ended; How, Stats
	evLeftovers  = "leftovers" // the leader found rows a cut-short run left; N
	evError      = "error"     // Msg
	evStopped    = "stopped"   // clean exit; Stats
	ruleStartup  = "start-up"
	rulePeriodic = "periodic"
)

// event is one line an instance writes.
type event struct {
	Ev     string         `json:"ev"`
	Holder string         `json:"holder,omitempty"`
	PID    int            `json:"pid,omitempty"`
	N      int            `json:"n,omitempty"`
	ID     int64          `json:"id,omitempty"`
	Fence  int64          `json:"fence,omitempty"`
	FireAt time.Time      `json:"fire_at,omitzero"`
	Rule   string         `json:"rule,omitempty"`
	To     map[string]int `json:"to,omitempty"` // swept rows per new state
	By     map[string]int `json:"by,omitempty"` // swept rows per holder of the stale claim
	How    string         `json:"how,omitempty"`
	Msg    string         `json:"msg,omitempty"`
	Stats  *counters      `json:"stats,omitempty"`
}

// counters is what an instance counts about itself.
type counters struct {
	TicksRun     int `json:"ticks_run"`
	TicksSkipped int `json:"ticks_skipped"`
	Claimed      int `json:"claimed"`  // rows resumed (claimed PAUSED → PROCESSING)
	Sent         int `json:"sent"`     // claims finished SENT
	Released     int `json:"released"` // claims given back on shutdown
	Lost         int `json:"lost"`     // claims found swept before their finish
	SweptFailed  int `json:"swept_failed"`
	SweptRetry   int `json:"swept_retry"`
	Terms        int `json:"terms"` // times elected
}

// reporter writes events as JSON lines; safe for concurrent use.
type reporter struct {
	mu     sync.Mutex
	enc    *json.Encoder
	holder string
}

func newReporter(w io.Writer, holder string) *reporter {
	return &reporter{enc: json.NewEncoder(w), holder: holder}
}

func (r *reporter) emit(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Holder == "" {
		e.Holder = r.holder
	}
	_ = r.enc.Encode(e)
}
