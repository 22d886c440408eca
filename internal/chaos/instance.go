package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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

	mu       sync.Mutex
	cfg      workerConfig // config of the next start
	state    instanceState
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	cur      *incarnation
	all      []*incarnation
	ready    chan struct{} // closed when the current incarnation said READY
	exited   chan struct{} // closed when the current process has exited
	inBatch  atomic.Bool
	batches  atomic.Int64
	unexpect []string // unexpected exits
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
	cmd := exec.Command(in.exe, "worker")
	cmd.Env = append(os.Environ(), envWorker+"="+string(raw))
	cmd.Stderr = logf
	// Own process group: a Ctrl-C aimed at the harness does not reach
	// the instances before the harness stops them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("chaos: start instance %s: %w", in.name, err)
	}
	logf.Close()
	inc := &incarnation{holder: fmt.Sprintf("%s#%d:%d", in.name, in.cfg.Incarnation, cmd.Process.Pid)}
	ready, exited := make(chan struct{}), make(chan struct{})
	in.cmd, in.stdin, in.cur, in.ready, in.exited = cmd, stdin, inc, ready, exited
	in.all = append(in.all, inc)
	in.state = stateRunning
	in.inBatch.Store(false)
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			switch sc.Text() {
			case msgReady:
				once.Do(func() { close(ready) })
			case msgBatchStart:
				in.inBatch.Store(true)
				in.batches.Add(1)
			case msgBatchEnd:
				in.inBatch.Store(false)
			}
		}
		err := cmd.Wait()
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

// kill SIGKILLs the current incarnation; it reports whether it was mid-batch.
func (in *instance) kill() (midBatch bool, ok bool) {
	in.mu.Lock()
	if in.state != stateRunning || in.cmd == nil {
		in.mu.Unlock()
		return false, false
	}
	midBatch = in.inBatch.Load()
	in.cur.end = "killed"
	in.state = stateKilled
	cmd, exited := in.cmd, in.exited
	in.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return midBatch, true
}

// pause SIGSTOPs the current incarnation.
func (in *instance) pause() (midBatch bool, ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != stateRunning || in.cmd == nil {
		return false, false
	}
	midBatch = in.inBatch.Load()
	if err := in.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return false, false
	}
	in.state = statePaused
	return midBatch, true
}

// resume SIGCONTs a paused incarnation.
func (in *instance) resume() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != statePaused {
		return
	}
	_ = in.cmd.Process.Signal(syscall.SIGCONT)
	in.state = stateRunning
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
	if in.cmd == nil || in.state == stateStopped {
		in.mu.Unlock()
		return
	}
	wasKilled := in.state == stateKilled
	if in.state == statePaused {
		_ = in.cmd.Process.Signal(syscall.SIGCONT)
	}
	in.state = stateStopped
	if !wasKilled && in.cur.end == "" {
		in.cur.end = "stopped"
	}
	cmd, exited := in.cmd, in.exited
	in.mu.Unlock()
	if wasKilled {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		in.mu.Lock()
		in.cur.end = "killed" // what it left running is a crash's leftovers
		in.mu.Unlock()
		_ = cmd.Process.Signal(syscall.SIGKILL)
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
