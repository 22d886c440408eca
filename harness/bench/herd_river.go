package bench

// River's side of the herd: the herdriver child, built once from
// harness/bench/herdriver, started and read line by line.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	childproc "github.com/pgclaim/pgclaim/harness/child"
)

// riverLine is one JSON line of River's side (harness/bench/herdriver):
// the fields of every mode's events.
type riverLine struct {
	Event      string  `json:"event"`
	Error      string  `json:"error"`
	Worked     int64   `json:"worked"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error"`
	Version    string  `json:"version"`
	LagsNs     []int64 `json:"lags_ns"`
	Inserted   int64   `json:"inserted"`
	Duplicates int64   `json:"duplicates"`
}

// startRiverSide starts River's side, bin with args, and returns it with
// a function that waits for its next line of an event kind (an "error"
// line ends the wait with its error).
func startRiverSide(bin string, args []string) (*childproc.Process, func(kind string, timeout time.Duration) (riverLine, error), error) {
	lines := make(chan riverLine, 16)
	proc, err := childproc.Start(childproc.Config{Exe: bin, Args: args,
		Stdout: func(b []byte) {
			var l riverLine
			if json.Unmarshal(b, &l) == nil {
				lines <- l
			}
		},
		StderrTo: os.Stderr,
	})
	if err != nil {
		return nil, nil, err
	}
	// match reports whether l is the event awaited, or the child's error.
	match := func(l riverLine, kind string) (bool, error) {
		if l.Event == "error" {
			return true, fmt.Errorf("river's side: %s", l.Error)
		}
		return l.Event == kind, nil
	}
	await := func(kind string, timeout time.Duration) (riverLine, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case l := <-lines:
				if ok, err := match(l, kind); ok {
					return l, err
				}
			case <-proc.Done():
				// Its output was all read before Done closed.
				for len(lines) > 0 {
					if l := <-lines; l.Event == kind || l.Event == "error" {
						_, err := match(l, kind)
						return l, err
					}
				}
				return riverLine{}, fmt.Errorf("river's side exited before %q: %v", kind, proc.Err())
			case <-t.C:
				return riverLine{}, fmt.Errorf("river's side: no %q within %s", kind, timeout)
			}
		}
	}
	return proc, await, nil
}

// herdRiver starts the River child on url and returns once its clients
// run; stop ends it and reads its report into hs.
func herdRiver(ctx context.Context, bin, url string, sh herdShape, hs *herdSide) (stop func() error, err error) {
	proc, await, err := startRiverSide(bin, []string{"-url", url, "-instances", fmt.Sprint(sh.Instances), "-schedules", fmt.Sprint(sh.Schedules),
		"-period", sh.Period.String(), "-pool", fmt.Sprint(herdPoolConns), "-workers", fmt.Sprint(sh.riverWorkers()),
		"-sleep", herdJobSleep.String(), "-prefix", "herd", "-table", "herd_effects"})
	if err != nil {
		return nil, err
	}
	kill := func() {
		_ = proc.Kill()
		<-proc.Done()
	}
	if _, err := await("ready", 2*time.Minute); err != nil {
		kill()
		return nil, err
	}
	return func() error {
		_ = proc.Stdin.Close()
		l, err := await("done", 30*time.Second)
		if err != nil {
			kill()
			return err
		}
		<-proc.Done()
		hs.errors += l.Errors
		hs.firstError = l.FirstError
		hs.riverVersion = l.Version
		return nil
	}, nil
}

// buildHerdRiver builds River's side (harness/bench/herdriver) once, or
// takes the binary named by PGCLAIM_BENCH_HERDRIVER. On failure it returns
// why, and the scenario runs without River.
func buildHerdRiver(ctx context.Context, e *env) (bin, why string) {
	if b := os.Getenv(envHerdRiver); b != "" {
		return b, ""
	}
	dir := findHerdRiver()
	if dir == "" {
		return "", "harness/bench/herdriver not found (run from the repository, or set " + envHerdRiver + " to a built herdriver)"
	}
	tmp, err := os.MkdirTemp("", "pgclaim-herdriver-")
	if err != nil {
		return "", err.Error()
	}
	bin = filepath.Join(tmp, "herdriver")
	e.prog.logf("  herd: building River's side (%s)...", dir)
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Sprintf("go build in %s: %v: %s", dir, err, firstLine(string(out)))
	}
	return bin, ""
}

// findHerdRiver finds harness/bench/herdriver from the working directory
// upwards, else beside this source file.
func findHerdRiver() string {
	const rel = "harness/bench/herdriver"
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, rel, "go.mod")); err == nil {
				return filepath.Join(d, rel)
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Join(filepath.Dir(file), "herdriver")
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return ""
}
