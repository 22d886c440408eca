package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Print writes the run's report: faults injected by kind, the workload's
// figures, every invariant with how much it covered and its violations
// (with examples), and the seed to replay a failed run.
func (r *Result) Print(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "\nchaos run: seed %d, %s of faults, %d instances (%d behind PgBouncer)%s, took %s%s\n\n",
		r.Seed, cfg.Duration, cfg.Instances, cfg.Bouncer, patroniNote(cfg), r.Duration.Round(time.Second), brokenNote(cfg.Broken))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault injected\tcount\tdetail")
	for _, f := range r.Faults {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", f.Kind, f.Count, f.Detail)
	}
	if len(r.Faults) == 0 {
		fmt.Fprintln(tw, "(none)\t\t")
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "workload\t")
	for _, s := range r.Stats {
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Value)
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "invariant\tchecked\tviolations\t")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", c.Name, c.Checked, c.Violations)
	}
	tw.Flush()

	for _, c := range r.Checks {
		if c.Violations == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d violations, e.g.\n", c.Name, c.Violations)
		for _, e := range c.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	fmt.Fprintf(w, "\nviolations: %d\n", r.Violations())
	if r.Violations() > 0 {
		fmt.Fprintf(w, "replay the fault schedule with: %s\n", r.ReplayCommand())
		if r.Dir != "" {
			fmt.Fprintf(w, "instance logs: %s\n", r.Dir)
		}
	}
}

// ReplayCommand is the command line that runs the same configuration and
// fault schedule again.
func (r *Result) ReplayCommand() string {
	cfg := r.Config
	args := []string{"go run ./harness/chaos/cmd/chaos", fmt.Sprintf("--seed %d", r.Seed), "--duration " + cfg.Duration.String()}
	if cfg.Instances != 4 {
		args = append(args, fmt.Sprintf("--instances %d", cfg.Instances))
	}
	if cfg.Patroni {
		args = append(args, "--patroni")
	}
	if cfg.Sync {
		args = append(args, "--sync")
	}
	faults := make([]string, len(cfg.Faults))
	for i, f := range cfg.Faults {
		faults[i] = string(f)
	}
	def := AllFaults
	if cfg.Patroni {
		def = PatroniFaults
	}
	switch {
	case len(faults) == 0:
		args = append(args, "--faults none")
	case len(faults) != len(def) || !sameFaults(cfg.Faults, def):
		args = append(args, "--faults "+strings.Join(faults, ","))
	}
	if cfg.FaultEvery != 1500*time.Millisecond {
		args = append(args, "--fault-every "+cfg.FaultEvery.String())
	}
	if cfg.Schedules != 50 {
		args = append(args, fmt.Sprintf("--schedules %d", cfg.Schedules))
	}
	if cfg.RowsPerSecond != 40 {
		args = append(args, fmt.Sprintf("--rate %d", cfg.RowsPerSecond))
	}
	if cfg.Broken != "" {
		args = append(args, "--broken "+cfg.Broken)
	}
	return strings.Join(args, " ")
}

func sameFaults(a, b []Fault) bool {
	for _, f := range a {
		if !slices.Contains(b, f) {
			return false
		}
	}
	return len(a) == len(b)
}
