package bench

// The instances scenario's child: one instance process, its report, and
// how the parent reads it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgclaim/pgclaim/gate"
)

// instanceReport is what an instance child reports at the end of its window.
type instanceReport struct {
	rows, batches, lost   int64
	claimP50, claimFor    time.Duration // claimFor: how long the claim loop ran
	onceWon, onceTried    int64
	onceP50, onceSkipP50  time.Duration
	onceErrors            int64
	firstError            string
	firstTick             time.Time // the first tick the instance fired
	outcomes              string    // per tick from firstTick: w won, t taken, h held, k skewed, e error, - not fired
	windowStart, windowTo time.Time
}

// runInstanceChild is the child's side: it opens its pool, claimer and
// gate, says "ready", waits for "go <window end, unix ns>" on stdin, then
// claims and fires ticks until the window ends and reports one "done" line.
func runInstanceChild() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &childOut{w: bufio.NewWriter(os.Stdout)}
	url, job := os.Getenv(envURL), os.Getenv(envJob)
	idx, _ := strconv.Atoi(os.Getenv(envInstance))
	pool, err := openPool(ctx, url, instancePoolConns)
	if err != nil {
		out.emit("error", oneLine(err.Error()))
		return 1
	}
	defer pool.Close()
	ops := handOps(pool, false)
	if os.Getenv(envHand) != "1" {
		if ops, err = pgclaimOpsSpread(pool, os.Getenv(envSpread) == "1"); err != nil {
			out.emit("error", oneLine(err.Error()))
			return 1
		}
	}
	g, err := gate.New(pool, gate.Config{Holder: fmt.Sprintf("i%d", idx), Logger: quiet, LedgerOnly: os.Getenv(envLedger) == "1"})
	if err != nil {
		out.emit("error", oneLine(err.Error()))
		return 1
	}
	defer g.Close()
	out.emit("ready")

	in := bufio.NewScanner(os.Stdin)
	var until time.Time
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 2 && f[0] == "go" {
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				until = time.Unix(0, ns)
				break
			}
		}
	}
	if until.IsZero() {
		return 0 // the parent went away
	}
	go func() { // the parent holds our stdin open; when it goes away, so do we
		for in.Scan() {
		}
		cancel()
	}()

	rep := instanceReport{windowStart: time.Now(), windowTo: until}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var (
			mu           sync.Mutex
			won, skipped []time.Duration
			tried, errs  atomic.Int64
			fired        sync.WaitGroup
			outcome      = map[time.Time]byte{}
		)
		fire := func(at time.Time) {
			t0 := time.Now()
			err := g.Once(ctx, job, at, func(context.Context, gate.Run) error { return nil })
			d := time.Since(t0)
			tried.Add(1)
			mu.Lock()
			defer mu.Unlock()
			o := byte('e')
			switch {
			case err == nil:
				o = 'w'
				won = append(won, d)
			case errors.As(err, new(*gate.HeldError)):
				// The job's lock was held by another tick's run, still
				// running: this tick is run nowhere, and said so (the
				// gate logs it at warn). The parent counts such ticks.
				// (A HeldError wraps ErrSkipped: this case comes first.)
				o = 'h'
				skipped = append(skipped, d)
				out.emit("held", at.UnixNano())
			case errors.Is(err, gate.ErrSkipped):
				o = 't'
				skipped = append(skipped, d)
			default:
				if errors.Is(err, gate.ErrClockSkew) {
					o = 'k'
				}
				if errs.Add(1) == 1 {
					rep.firstError = oneLine(err.Error())
				}
			}
			outcome[at] = o
		}
		next := time.Now().Truncate(instanceTick).Add(instanceTick)
		for {
			at := next
			next = next.Add(instanceTick)
			if !at.Before(until) {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			fired.Add(1)
			go func() { // each tick on its own goroutine, as a cron library fires it
				defer fired.Done()
				fire(at)
			}()
		}
		fired.Wait()
		for at := range outcome {
			if rep.firstTick.IsZero() || at.Before(rep.firstTick) {
				rep.firstTick = at
			}
		}
		var b strings.Builder
		for at := rep.firstTick; !rep.firstTick.IsZero() && at.Before(until); at = at.Add(instanceTick) {
			if o, ok := outcome[at]; ok {
				b.WriteByte(o)
			} else {
				b.WriteByte('-')
			}
		}
		rep.outcomes = b.String()
		rep.onceWon, rep.onceTried, rep.onceErrors = int64(len(won)), tried.Load(), errs.Load()
		rep.onceP50, rep.onceSkipP50 = summarize(won).P50, summarize(skipped).P50
	}()
	var rows atomic.Int64
	cr, err := drainBatches(ctx, pool, 1, instanceBatch, until, func(int) batchOps { return ops(idx) }, &rows)
	wg.Wait()
	if err != nil {
		out.emit("error", oneLine(err.Error()))
		return 1
	}
	rep.rows, rep.batches, rep.lost, rep.claimP50, rep.claimFor = cr.rows, cr.batches, cr.lost, cr.lat.P50, cr.elapsed
	out.emit("done", rep.rows, rep.batches, rep.lost, rep.claimP50.Nanoseconds(), rep.claimFor.Nanoseconds(),
		rep.onceWon, rep.onceTried, rep.onceP50.Nanoseconds(), rep.onceSkipP50.Nanoseconds(), rep.onceErrors,
		rep.firstTick.UnixNano(), "x"+rep.outcomes, strconv.Quote(rep.firstError))
	return 0
}

// parseInstanceDone reads a child's "done" line.
func parseInstanceDone(line string) (instanceReport, error) {
	f := strings.Fields(line)
	if len(f) < 14 || f[0] != "done" || !strings.HasPrefix(f[12], "x") {
		return instanceReport{}, fmt.Errorf("bad report %q", line)
	}
	n := make([]int64, 11)
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return instanceReport{}, fmt.Errorf("bad report %q: %w", line, err)
		}
		n[i] = v
	}
	first, _ := strconv.Unquote(strings.Join(f[13:], " "))
	rep := instanceReport{
		rows: n[0], batches: n[1], lost: n[2], claimP50: time.Duration(n[3]), claimFor: time.Duration(n[4]),
		onceWon: n[5], onceTried: n[6], onceP50: time.Duration(n[7]), onceSkipP50: time.Duration(n[8]),
		onceErrors: n[9], firstError: first, outcomes: f[12][1:],
	}
	if n[10] != 0 {
		rep.firstTick = time.Unix(0, n[10])
	}
	return rep, nil
}

// boolEnv is "1" for true, "0" for false.
func boolEnv(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
