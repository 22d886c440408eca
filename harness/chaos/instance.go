package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgclaim/pgclaim/harness/child"
)

// instanceState says what the harness last did to an instance.
type instanceState int

const (
	stateRunning instanceState = iota
	statePaused                // SIGSTOPped
	stateKilled                // SIGKILLed, restart pending
	stateStopped               // stopped for good
)

// incarnation is one process of an instance.
type incarnation struct {
	holder string // as recorded by pgclaim: "i2#3:pid"
	end    string // "killed", "stopped", "exited: <err>" or "" while running
}

// instance is one of the M instance processes, restarted after each kill.
type instance struct {
	name    string
	bouncer bool
	exe     string
	logPath string
	// observe, when set, sees every line the instance writes (the Patroni
	// mode's acknowledgements); set before the first start.
	observe func(line []byte)

	mu       sync.Mutex
	cfg      workerConfig // config of the next start
	state    instanceState
	proc     *child.Process
	stdin    io.WriteCloser
	cur      *incarnation
	all      []*incarnation
	ready    chan struct{} // closed when the current incarnation said READY
	exited   chan struct{} // closed when the current process has exited
	inBatch  atomic.Bool
	batches  atomic.Int64
	inRuns   atomic.Int64 // schedule jobs running, from the process's messages
	unexpect []string     // unexpected exits
}

// start launches a new incarnation with the instance's config.
func (in *instance) start() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.cfg.Incarnation = len(in.all)
	raw, err := json.Marshal(in.cfg)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	in.inBatch.Store(false) // before the new process's lines arrive
	in.inRuns.Store(0)
	inc := &incarnation{}
	ready, exited := make(chan struct{}), make(chan struct{})
	once := sync.Once{}
	proc, err := child.Start(child.Config{
		Exe:      in.exe,
		Args:     []string{"worker"},
		Env:      []string{envWorker + "=" + string(raw)},
		StderrTo: logf,
		// Own process group: a Ctrl-C aimed at the harness does not reach
		// the instances before the harness stops them.
		OwnGroup: true,
		Stdout: func(line []byte) {
			if in.observe != nil {
				in.observe(line)
			}
			switch string(line) {
			case msgReady:
				once.Do(func() { close(ready) })
			case msgBatchStart:
				in.inBatch.Store(true)
				in.batches.Add(1)
			case msgBatchEnd:
				in.inBatch.Store(false)
			case msgRunStart:
				in.inRuns.Add(1)
			case msgRunEnd:
				in.inRuns.Add(-1)
			}
		},
	})
	logf.Close()
	if err != nil {
		return fmt.Errorf("chaos: start instance %s: %w", in.name, err)
	}
	inc.holder = fmt.Sprintf("%s#%d:%d", in.name, in.cfg.Incarnation, proc.Pid())
	in.proc, in.stdin, in.cur, in.ready, in.exited = proc, proc.Stdin, inc, ready, exited
	in.all = append(in.all, inc)
	in.state = stateRunning
	go func() {
		err := proc.Err()
		in.mu.Lock()
		if inc.end == "" {
			inc.end = fmt.Sprintf("exited: %v", err)
			in.unexpect = append(in.unexpect, inc.holder+" "+inc.end)
		}
		in.mu.Unlock()
		close(exited)
	}()
	return nil
}

// waitReady waits until the current incarnation is ready.
func (in *instance) waitReady(timeout time.Duration) error {
	in.mu.Lock()
	ready, exited := in.ready, in.exited
	in.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("chaos: instance %s exited during start-up (log: %s)", in.name, in.logPath)
	case <-time.After(timeout):
		return fmt.Errorf("chaos: instance %s not ready after %s (log: %s)", in.name, timeout, in.logPath)
	}
}

func (in *instance) getState() instanceState {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.state
}

// hit is what a kill or a SIGSTOP hit.
type hit struct {
	holder   string
	midBatch bool // holding claims
	midRun   bool // running a schedule's job
	at       time.Time
}

// kill SIGKILLs the current incarnation; it reports what it hit.
func (in *instance) kill() (h hit, ok bool) {
	in.mu.Lock()
	if in.state != stateRunning || in.proc == nil {
		in.mu.Unlock()
		return h, false
	}
	h = hit{holder: in.cur.holder, midBatch: in.inBatch.Load(), midRun: in.inRuns.Load() > 0}
	in.cur.end = "killed"
	in.state = stateKilled
	proc, exited := in.proc, in.exited
	in.mu.Unlock()
	h.at = time.Now()
	_ = proc.Signal(syscall.SIGKILL)
	<-exited
	return h, true
}

// pause SIGSTOPs the current incarnation.
func (in *instance) pause() (h hit, ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != stateRunning || in.proc == nil {
		return h, false
	}
	h = hit{holder: in.cur.holder, midBatch: in.inBatch.Load(), midRun: in.inRuns.Load() > 0, at: time.Now()}
	if err := in.proc.Signal(syscall.SIGSTOP); err != nil {
		return h, false
	}
	in.state = statePaused
	return h, true
}

// resume SIGCONTs a paused incarnation; it returns when (zero if it was
// not paused).
func (in *instance) resume() time.Time {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != statePaused {
		return time.Time{}
	}
	at := time.Now()
	_ = in.proc.Signal(syscall.SIGCONT)
	in.state = stateRunning
	return at
}

// setOffset changes the instance's clock offset, now and for later starts.
func (in *instance) setOffset(ms int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.cfg.OffsetMS = ms
	if in.stdin != nil && in.state != stateKilled && in.state != stateStopped {
		// A paused process reads it when it wakes.
		_, _ = fmt.Fprintf(in.stdin, "offset %d\n", ms)
	}
}

// stop ends the current incarnation with SIGTERM (SIGKILL after timeout).
func (in *instance) stop(timeout time.Duration) {
	in.mu.Lock()
	if in.proc == nil || in.state == stateStopped {
		in.mu.Unlock()
		return
	}
	wasKilled := in.state == stateKilled
	if in.state == statePaused {
		_ = in.proc.Signal(syscall.SIGCONT)
	}
	in.state = stateStopped
	if !wasKilled && in.cur.end == "" {
		in.cur.end = "stopped"
	}
	proc, exited := in.proc, in.exited
	in.mu.Unlock()
	if wasKilled {
		return
	}
	_ = proc.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		in.mu.Lock()
		in.cur.end = "killed" // what it left running is a crash's leftovers
		in.mu.Unlock()
		_ = proc.Signal(syscall.SIGKILL)
		<-exited
	}
}

func (in *instance) incarnations() []incarnation {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]incarnation, len(in.all))
	for i, c := range in.all {
		out[i] = *c
	}
	return out
}

func (in *instance) unexpectedExits() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.unexpect...)
}

func instanceLog(dir, name string) string { return filepath.Join(dir, "instance-"+name+".log") }
