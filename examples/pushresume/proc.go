package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/pgclaim/pgclaim/harness/child"
)

// proc is one instance process started by the orchestrator.
type proc struct {
	label string // shown in the live view and the summary
	child *child.Process
	stdin io.WriteCloser
	pid   int

	// Filled from the instance's events by the orchestrator's loop.
	holder      string
	ready       bool
	registered  bool      // registered the schedule
	attempt     int       // the attempt it runs (or ran last); 0: none
	fence       int64     // that attempt's fence
	finished    string    // the state its last attempt ended in ("" while running)
	sending     int       // sends started
	firstSend   time.Time // when its first send started, by its clock
	atResume    bool      // it was running when the first resume committed
	pickupShown bool      // its pickup was printed
	stopped     *counters // the instance's own counts, at a clean exit
	seen        counters  // counts gathered from its events
	swept       int       // rows it swept

	killed bool
	exited bool
	err    error // from Wait

	stopOnce sync.Once
}

// procEvent is what a proc's reader hands the orchestrator: an event, or
// (exit set) the process has exited.
type procEvent struct {
	p    *proc
	e    event
	exit bool
	err  error
}

// startProc starts exe with args, env added to the orchestrator's
// environment. Its events go to events; its standard error is copied to
// stderr, each line prefixed with label.
func startProc(label, exe string, args, env []string, events chan<- procEvent, stderr io.Writer) (*proc, error) {
	p := &proc{label: label}
	made := make(chan struct{}) // p is complete: its events may be sent
	c, err := child.Start(child.Config{
		Exe: exe, Args: args, Env: env,
		Stderr: func(line []byte) { fmt.Fprintf(stderr, "%s| %s\n", label, line) },
		Stdout: func(line []byte) {
			<-made
			var e event
			if err := json.Unmarshal(line, &e); err != nil {
				fmt.Fprintf(stderr, "%s| %s\n", label, line)
				return
			}
			events <- procEvent{p: p, e: e}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", label, err)
	}
	p.child, p.stdin, p.pid = c, c.Stdin, c.Pid()
	close(made)
	go func() {
		err := c.Err()
		events <- procEvent{p: p, exit: true, err: err}
	}()
	return p, nil
}

// setClock tells the instance the demo's 09:00: it registers the schedule
// to run daily at at's time of day.
func (p *proc) setClock(at time.Time) error {
	_, err := fmt.Fprintf(p.stdin, "daily-at %s\n", at.UTC().Format(time.RFC3339Nano))
	return err
}

// stop asks the instance to shut down cleanly.
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		_, _ = io.WriteString(p.stdin, "stop\n")
		_ = p.stdin.Close()
	})
}

// kill ends the process with SIGKILL: no clean-up of any kind runs.
func (p *proc) kill() error {
	p.killed = true
	return p.child.Kill()
}

// short returns the first line of s.
func short(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
