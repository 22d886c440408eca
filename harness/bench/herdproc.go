package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	childproc "github.com/pgclaim/pgclaim/harness/child"
	"github.com/pgclaim/pgclaim/schedule"
)

// The herd's pgclaim side with every instance a process of its own
// (herdShape.Processes): this executable re-run with envChild "herd", one
// scheduler per process, as instances of a service run. The child reads
// lines on its standard input: "count" asks for the statements sent so far
// (it answers "count N"); the end of its input stops it, and it reports
// "done" followed by herdChildReport as JSON.
const (
	envHerdSchedules = "PGCLAIM_BENCH_HERD_SCHEDULES"
	envHerdPeriod    = "PGCLAIM_BENCH_HERD_PERIOD"
	envHerdHolder    = "PGCLAIM_BENCH_HERD_HOLDER" // the instance's number
	envHerdLease     = "PGCLAIM_BENCH_HERD_LEASE"  // "true": LeaseLocks (behind PgBouncer)
	envHerdMaxConc   = "PGCLAIM_BENCH_HERD_MAX_CONCURRENT"
)

// herdChildReport is what a herd child reports when it stops.
type herdChildReport struct {
	Errors     int64                        `json:"errors"`
	FirstError string                       `json:"first_error,omitempty"`
	Events     map[schedule.EventKind]int64 `json:"events"`
	Logged     map[string]int64             `json:"logged"`
	StopError  string                       `json:"stop_error,omitempty"`
}

// runHerdChild is the child's side: one instance of the herd.
func runHerdChild() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &childOut{w: bufio.NewWriter(os.Stdout)}
	schedules, err1 := strconv.Atoi(os.Getenv(envHerdSchedules))
	period, err2 := time.ParseDuration(os.Getenv(envHerdPeriod))
	holder, err3 := strconv.Atoi(os.Getenv(envHerdHolder))
	if err := errors.Join(err1, err2, err3); err != nil {
		out.emit("error", oneLine(err.Error()))
		return 2
	}
	maxConc, _ := strconv.Atoi(os.Getenv(envHerdMaxConc)) // absent: 0, the default
	sh := herdShape{Instances: 1, Schedules: schedules, Period: period, HolderFrom: holder, Bouncer: os.Getenv(envHerdLease) == "true", MaxConcurrent: maxConc}
	errs, events := &herdErrs{}, &schedEvents{}
	stop, stmts, startErrs, logs, err := herdSchedulers(ctx, os.Getenv(envURL), sh, errs, events)
	if err != nil {
		out.emit("error", oneLine(err.Error()))
		return 1
	}
	out.emit("ready", startErrs)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "count" {
			out.emit("count", stmts())
		}
	}
	rep := herdChildReport{Errors: errs.n.Load(), Logged: map[string]int64{}}
	if err := stop(); err != nil {
		rep.StopError = oneLine(err.Error())
	}
	errs.mu.Lock()
	rep.FirstError = errs.first
	errs.mu.Unlock()
	events.mu.Lock()
	rep.Events = events.n
	events.mu.Unlock()
	logs.mu.Lock()
	for k, n := range logs.n {
		rep.Logged[k] = n
	}
	logs.mu.Unlock()
	b, err := json.Marshal(rep)
	if err != nil {
		out.emit("error", oneLine(err.Error()))
		return 1
	}
	out.emit("done", string(b))
	return 0
}

// herdChild is one running herd child, seen from the parent.
type herdChild struct {
	p           *childproc.Process
	ready       chan error
	startErrors int64 // Register calls that failed (before ready)
	counts      chan int64
	done        chan herdChildReport
}

// herdProcesses starts sh.Instances herd children and returns once every
// one runs; it has herdSchedulers' results, gathered from the children.
func herdProcesses(ctx context.Context, url string, sh herdShape, errs *herdErrs, events *schedEvents) (stop func() error, stmts func() int64, startErrs int64, logs *logCount, err error) {
	logs = newLogCount()
	kids := make([]*herdChild, 0, sh.Instances)
	kill := func() {
		for _, k := range kids {
			_ = k.p.Kill()
		}
	}
	for i := range sh.Instances {
		k := &herdChild{ready: make(chan error, 1), counts: make(chan int64, 1), done: make(chan herdChildReport, 1)}
		k.p, err = childproc.Start(childproc.Config{
			Env: []string{envChild + "=herd", envURL + "=" + url, envHerdSchedules + "=" + strconv.Itoa(sh.Schedules),
				envHerdPeriod + "=" + sh.Period.String(), envHerdHolder + "=" + strconv.Itoa(sh.HolderFrom+i),
				envHerdLease + "=" + strconv.FormatBool(sh.Bouncer), envHerdMaxConc + "=" + strconv.Itoa(sh.MaxConcurrent)},
			OwnGroup: true,
			StderrTo: io.Discard,
			Stdout:   k.line,
		})
		if err != nil {
			kill()
			return nil, nil, 0, nil, fmt.Errorf("herd: start instance %d: %w", i, err)
		}
		kids = append(kids, k)
	}
	deadline := time.After(2*time.Minute + time.Duration(sh.Schedules)*20*time.Millisecond)
	for i, k := range kids {
		select {
		case err = <-k.ready:
		case <-k.p.Done():
			err = fmt.Errorf("exited: %v", k.p.Err())
		case <-deadline:
			err = errors.New("not ready in time")
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			kill()
			return nil, nil, 0, nil, fmt.Errorf("herd: instance %d: %w", i, err)
		}
		startErrs += k.startErrors
	}
	stmts = func() int64 {
		var n int64
		for _, k := range kids {
			if _, err := io.WriteString(k.p.Stdin, "count\n"); err != nil {
				continue
			}
			select {
			case c := <-k.counts:
				n += c
			case <-k.p.Done():
			case <-time.After(10 * time.Second):
			}
		}
		return n
	}
	stop = func() error {
		for _, k := range kids {
			_ = k.p.Stdin.Close()
		}
		var err error
		timeout := time.After(60 * time.Second)
		for i, k := range kids {
			var rep herdChildReport
			select {
			case rep = <-k.done:
			case <-k.p.Done():
				// The report, when there is one, was read before Done.
				select {
				case rep = <-k.done:
				default:
					err = cmpErr(err, fmt.Errorf("herd: instance %d exited without a report: %v", i, k.p.Err()))
					continue
				}
			case <-timeout:
				kill()
				return cmpErr(err, errors.New("herd: the instances did not stop within 60 s"))
			}
			rep.addTo(errs, events, logs)
			if rep.StopError != "" {
				err = cmpErr(err, fmt.Errorf("herd: instance %d: %s", i, rep.StopError))
			}
		}
		return err
	}
	return stop, stmts, startErrs, logs, nil
}

// line handles one line of a herd child's output.
func (k *herdChild) line(b []byte) {
	kind, rest, _ := strings.Cut(string(b), " ")
	switch kind {
	case "ready":
		k.startErrors, _ = strconv.ParseInt(rest, 10, 64)
		k.ready <- nil
	case "error":
		select {
		case k.ready <- errors.New(rest):
		default:
		}
	case "count":
		n, _ := strconv.ParseInt(rest, 10, 64)
		k.counts <- n
	case "done":
		var rep herdChildReport
		if err := json.Unmarshal([]byte(rest), &rep); err != nil {
			rep.StopError = "report: " + err.Error()
		}
		k.done <- rep
	}
}

// herdSchedulersFor is the pgclaim side of sh: instances in this process,
// or each a process of its own.
func herdSchedulersFor(ctx context.Context, url string, sh herdShape, errs *herdErrs, events *schedEvents) (func() error, func() int64, int64, *logCount, error) {
	if sh.Processes {
		return herdProcesses(ctx, url, sh, errs, events)
	}
	return herdSchedulers(ctx, url, sh, errs, events)
}

// addTo adds a child's report to the side's counts.
func (rep herdChildReport) addTo(errs *herdErrs, events *schedEvents, logs *logCount) {
	errs.n.Add(rep.Errors)
	errs.mu.Lock()
	if errs.first == "" {
		errs.first = rep.FirstError
	}
	errs.mu.Unlock()
	events.mu.Lock()
	if events.n == nil {
		events.n = map[schedule.EventKind]int64{}
	}
	for kind, n := range rep.Events {
		events.n[kind] += n
	}
	events.mu.Unlock()
	logs.mu.Lock()
	for msg, n := range rep.Logged {
		logs.n[msg] += n
	}
	logs.mu.Unlock()
}
