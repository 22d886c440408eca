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
	evReady      = "ready"      // migrated, swept at start-up, worker and scheduler running; Holder, PID, Msg (migrations applied)
	evWorker     = "worker"     // how the claim worker learns of READY rows (its log record); Msg
	evSwept      = "swept"      // a sweep moved rows; Rule, N, To, By
	evRegistered = "registered" // the schedule was registered; Msg describes it
	evLedger     = "ledger"     // the schedule's newest run at registration; FireAt, State, Attempt, Fence, Msg (holder)
	evAttempt    = "attempt"    // an attempt of a run started here; FireAt, How (run kind), Attempt, Fence
	evTakenOver  = "taken-over" // this instance took over a run whose holder died; Attempt, Fence, Msg (why)
	evWaiting    = "waiting"    // an attempt waits for its rows to be sent: N READY, By PROCESSING per holder
	evFinished   = "finished"   // an attempt ended; State, Msg (error or reason)
	evLost       = "lost"       // an attempt lost its exclusivity; Msg
	evSkipped    = "skipped"    // an instant was recorded skipped or missed; Msg
	evSending    = "sending"    // work on one push began; ID, Fence, At
	evResumed    = "resumed"    // an attempt's resume committed: N rows PAUSED → READY; How, Attempt, At (its COMMIT sent), Took (the COMMIT's round trip)
	evError      = "error"      // Msg
	evStopped    = "stopped"    // clean exit; Stats
	ruleStartup  = "start-up"
)

// event is one line an instance writes.
type event struct {
	Ev      string         `json:"ev"`
	Holder  string         `json:"holder,omitempty"`
	PID     int            `json:"pid,omitempty"`
	N       int            `json:"n,omitempty"`
	ID      int64          `json:"id,omitempty"`
	Fence   int64          `json:"fence,omitempty"`
	Attempt int            `json:"attempt,omitempty"`
	State   string         `json:"state,omitempty"`
	FireAt  time.Time      `json:"fire_at,omitzero"`
	Rule    string         `json:"rule,omitempty"`
	At      time.Time      `json:"at,omitzero"`   // this instance's clock (the demo's instances share a host)
	Took    time.Duration  `json:"took,omitzero"` // how long a statement took
	To      map[string]int `json:"to,omitempty"`  // swept rows per new state
	By      map[string]int `json:"by,omitempty"`  // per holder: the stale claims swept (swept), the claims under way (waiting)
	How     string         `json:"how,omitempty"`
	Msg     string         `json:"msg,omitempty"`
	Stats   *counters      `json:"stats,omitempty"`
}

// counters is what an instance counts about itself.
type counters struct {
	Attempts    int `json:"attempts"`  // attempts of the schedule's runs started
	Completed   int `json:"completed"` // attempts that ended succeeded
	Resumed     int `json:"resumed"`   // rows its resumes moved PAUSED → READY
	Claimed     int `json:"claimed"`   // rows its worker claimed (READY → PROCESSING)
	Sent        int `json:"sent"`      // claims its worker finished SENT
	Released    int `json:"released"`  // claims given back on shutdown
	Lost        int `json:"lost"`      // claims found swept before their finish
	SweptFailed int `json:"swept_failed"`
	SweptRetry  int `json:"swept_retry"`
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
