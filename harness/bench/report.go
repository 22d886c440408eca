package bench

// A run's report: its scenarios, tables, results, checks and ratios, and
// whether it failed.

import (
	"errors"
	"fmt"
	"time"
)

// Report is the outcome of a run, printed as tables or JSON.
type Report struct {
	Command   string            `json:"command"`
	Quick     bool              `json:"quick"`
	Started   time.Time         `json:"started"`
	Seconds   float64           `json:"seconds"`
	Machine   Machine           `json:"machine"`
	Scenarios []*ScenarioReport `json:"scenarios"`
	Ratios    []Ratio           `json:"ratios,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	OS             string            `json:"os"`
	Arch           string            `json:"arch"`
	CPUs           int               `json:"cpus"`
	CPUModel       string            `json:"cpu_model,omitempty"`
	MemoryGiB      float64           `json:"memory_gib,omitempty"`
	Go             string            `json:"go"`
	Postgres       string            `json:"postgres"`
	ServerSource   string            `json:"server_source"`
	Settings       map[string]string `json:"settings,omitempty"`
	StatementStats bool              `json:"statement_stats"`
}

// ScenarioReport is what one scenario measured.
type ScenarioReport struct {
	Name     string    `json:"name"`
	Title    string    `json:"title"`
	Setup    []string  `json:"setup,omitempty"`
	Tables   []Table   `json:"tables,omitempty"`
	Results  []Result  `json:"results,omitempty"`
	Checks   []Check   `json:"checks,omitempty"`
	Profiles []Profile `json:"profiles,omitempty"`
	Notes    []string  `json:"notes,omitempty"`
	Seconds  float64   `json:"seconds"`
	Error    string    `json:"error,omitempty"`
}

// Table is a titled table of text cells, as printed.
type Table struct {
	Title   string     `json:"title"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
}

// Result is one measured configuration.
type Result struct {
	Group     string             `json:"group"` // "pgclaim" or "baseline"
	Name      string             `json:"name"`
	Workers   int                `json:"workers,omitempty"`
	Batch     int                `json:"batch,omitempty"`
	TableRows int64              `json:"table_rows,omitempty"`
	Ops       int64              `json:"ops"`
	Unit      string             `json:"unit"`
	Seconds   float64            `json:"seconds"`
	PerSecond float64            `json:"per_second"`
	P50us     float64            `json:"p50_us,omitempty"`
	P99us     float64            `json:"p99_us,omitempty"`
	MaxUs     float64            `json:"max_us,omitempty"`
	Extra     map[string]float64 `json:"extra,omitempty"`
}

// Check is an invariant verified by counting; Got must equal Want.
type Check struct {
	Name string `json:"name"`
	Want int64  `json:"want"`
	Got  int64  `json:"got"`
	OK   bool   `json:"ok"`
}

// Ratio compares two figures of the same run.
type Ratio struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Of    string  `json:"of"`
	To    string  `json:"to"`
}

// Failed reports whether any check failed or any scenario ended in error.
func (r *Report) Failed() bool {
	for _, s := range r.Scenarios {
		if s.Error != "" {
			return true
		}
		for _, c := range s.Checks {
			if !c.OK {
				return true
			}
		}
	}
	return false
}

// Problems lists the failed checks and scenario errors, one per line.
func (r *Report) Problems() []string {
	var out []string
	for _, s := range r.Scenarios {
		if s.Error != "" {
			out = append(out, fmt.Sprintf("%s: %s", s.Name, s.Error))
		}
		for _, c := range s.Checks {
			if !c.OK {
				out = append(out, fmt.Sprintf("%s: got %d, want %d", c.Name, c.Got, c.Want))
			}
		}
	}
	return out
}

func (s *ScenarioReport) check(name string, want, got int64) {
	s.Checks = append(s.Checks, Check{Name: name, Want: want, Got: got, OK: want == got})
}

func (s *ScenarioReport) setup(format string, args ...any) {
	s.Setup = append(s.Setup, fmt.Sprintf(format, args...))
}

func (s *ScenarioReport) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// ErrChecksFailed is returned by Run when a duplicate (or another invariant)
// check failed; the report says which.
var ErrChecksFailed = errors.New("bench: invariant checks failed")
