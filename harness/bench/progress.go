package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress reports what the run is doing on a writer (stderr): one line
// rewritten in place on a terminal, a line every few seconds otherwise.
type progress struct {
	w   io.Writer
	tty bool

	mu     sync.Mutex
	active bool // a \r line is on screen
}

func newProgress(w io.Writer) *progress {
	if w == nil {
		w = io.Discard
	}
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// logf prints a line of its own.
func (p *progress) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.active {
		fmt.Fprint(p.w, "\r\033[K")
		p.active = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// task shows label with a counter read from count every tick: done/total
// and the rate. total may be 0 (unknown). The returned func ends the task
// and prints its final line.
func (p *progress) task(label, unit string, total int64, count func() int64) (end func()) {
	start := time.Now()
	line := func() string {
		n := count()
		el := time.Since(start)
		rate := perSec(n, el)
		if total > 0 {
			return fmt.Sprintf("%s  %s/%s %s (%3.0f%%)  %s/s  %.1fs", label, human(float64(n)), human(float64(total)), unit,
				100*float64(n)/float64(total), human(rate), el.Seconds())
		}
		return fmt.Sprintf("%s  %s %s  %s/s  %.1fs", label, human(float64(n)), unit, human(rate), el.Seconds())
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := 250 * time.Millisecond
		if !p.tty {
			every = 5 * time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				p.mu.Lock()
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K"+line())
					p.active = true
				} else {
					fmt.Fprintln(p.w, line())
				}
				p.mu.Unlock()
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		p.logf("%s", line())
	}
}

// human formats n with a k/M suffix.
func human(n float64) string {
	switch {
	case n >= 10e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", n/1e6)
	case n >= 10e3:
		return fmt.Sprintf("%.1fk", n/1e3)
	case n >= 1e3:
		return fmt.Sprintf("%.2fk", n/1e3)
	default:
		return fmt.Sprintf("%.0f", n)
	}
}
