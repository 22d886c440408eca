package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// stallAfter is how long the harness's probe may wait for the database
// before the wait counts as a stall.
const stallAfter = time.Second

// span is an interval of host time.
type span struct{ from, to time.Time }

// stallWatch measures how the database answers: every 200 ms a one-row
// write transaction (a commit waits for its WAL flush, as the instances'
// do) on the harness's own pool, which reaches Postgres directly. A probe
// answered after more than stallAfter, or failing until a later one is
// answered, marks a stall from its send to the answer. A liveness bound
// (how soon a SIGKILLed runner's instant is taken over) is extended by the
// stalls inside it: time in which the database, or the machine it shares
// with every instance, was not answering a trivial statement, not a delay
// of the code under test.
type stallWatch struct {
	mu     sync.Mutex
	stalls []span
	probes int
}

func (w *stallWatch) run(ctx context.Context, pool *pgxpool.Pool) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var failingSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := pool.Exec(qctx, `UPDATE chaos_probe SET at = clock_timestamp()`)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if failingSince.IsZero() {
				failingSince = sent
			}
			continue
		}
		from := sent
		if !failingSince.IsZero() {
			from, failingSince = failingSince, time.Time{}
		}
		end := time.Now()
		w.mu.Lock()
		w.probes++
		if end.Sub(from) > stallAfter {
			w.stalls = append(w.stalls, span{from, end})
		}
		w.mu.Unlock()
	}
}

// spans returns the stalls seen so far.
func (w *stallWatch) spans() []span {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]span(nil), w.stalls...)
}

// summary describes the stalls for the report.
func (w *stallWatch) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var total, longest time.Duration
	for _, s := range w.stalls {
		total += s.to.Sub(s.from)
		longest = max(longest, s.to.Sub(s.from))
	}
	if len(w.stalls) == 0 {
		return fmt.Sprintf("%d probes, none waited over %s", w.probes, stallAfter)
	}
	return fmt.Sprintf("%d probes, %d waited over %s (longest %s, %s in all)", w.probes, len(w.stalls), stallAfter,
		longest.Round(time.Millisecond), total.Round(time.Millisecond))
}

// stalledWithin is how much of [from, to] the stalls cover (overlapping
// stalls counted once).
func stalledWithin(stalls []span, from, to time.Time) time.Duration {
	var d time.Duration
	cur := from
	for _, s := range stalls { // in order: one probe at a time
		a, b := s.from, s.to
		if a.Before(cur) {
			a = cur
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
			cur = b
		}
	}
	return d
}
