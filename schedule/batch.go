package schedule

// Batching: the runners of the schedules due at one moment each read their
// state, seize their lease and release it at about the same time. Each of
// those goes in one statement for all the runners waiting, rather than one
// statement each queued for the pool. A call waits only for the statement
// in flight, if any, and then goes with every call that came meanwhile.
//
// A statement the server refuses for what one call brought (a row a
// trigger or constraint rejects) fails the calls sent with it too; the
// batch is then halved and each half sent again, until the calls at fault
// stand alone: only they get the error, the others their answers, at the
// cost of a few statements per call at fault. A failure that is the
// statement's or the server's (a lost connection, a deadline, a missing
// privilege or table, a busy server) fails the batch as it is: sending it
// again in parts would only multiply it.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// batchWait bounds a batch's statements when no caller has a deadline.
const batchWait = 30 * time.Second

// batcher sends the calls that wait together through send, which answers
// each input with one output, in order, or fails them all. Send must give
// each input the answer it would get in a batch of its own (a batch is
// split when it fails for one input's sake, see byInput).
type batcher[In, Out any] struct {
	send func(ctx context.Context, ins []In) ([]Out, error)
	// gather, when set, is how long a batch waits for more calls before
	// it is sent (for calls off the path to a job's start), while batches
	// come with more than one call: a lone caller (one runner working off
	// a backlog) does not wait.
	gather time.Duration

	mu      sync.Mutex
	calls   []*batchCall[In, Out]
	sending bool // a goroutine is sending batches
	last    int  // the number of calls of the last batch sent (kept while idle)
	// want, when set, is how many calls the next batch waits for (see
	// expect): until full is closed, for at most wait from its first call.
	// An expectation no call came for by wantBy is dropped.
	want   int
	wait   time.Duration
	wantBy time.Time
	full   chan struct{}
}

// expectStale is how long an expectation holds when none of its calls comes.
const expectStale = time.Second

// expect makes the next batch wait, for at most d from its first call,
// until n calls have come: the caller has just handed out n calls that
// are on their way (the runners of one share-out), which then go in one
// statement rather than the first alone and the others after it.
func (b *batcher[In, Out]) expect(n int, d time.Duration) {
	if n < 2 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.want, b.wait, b.wantBy, b.full = n, d, time.Now().Add(expectStale), make(chan struct{})
	if len(b.calls) >= n {
		close(b.full)
		b.want = 0
	}
}

type batchCall[In, Out any] struct {
	ctx context.Context
	in  In
	res chan batchResult[Out]
}

type batchResult[Out any] struct {
	out Out
	err error
}

// do sends in with the other calls waiting, and returns its output when the
// batch answered or ctx ended.
func (b *batcher[In, Out]) do(ctx context.Context, in In) (Out, error) {
	c := &batchCall[In, Out]{ctx: ctx, in: in, res: make(chan batchResult[Out], 1)}
	b.mu.Lock()
	b.calls = append(b.calls, c)
	if b.want > 0 && len(b.calls) >= b.want {
		close(b.full)
		b.want = 0
	}
	if !b.sending {
		b.sending = true
		go b.sendAll()
	}
	b.mu.Unlock()
	select {
	case r := <-c.res:
		return r.out, r.err
	case <-ctx.Done():
		var zero Out
		return zero, ctx.Err()
	}
}

// sendAll sends batches until no call is waiting.
func (b *batcher[In, Out]) sendAll() {
	for {
		b.mu.Lock()
		gather := b.gather > 0 && b.last > 1
		full, wait := b.full, b.wait
		if b.want == 0 || time.Now().After(b.wantBy) {
			full = nil
		}
		b.mu.Unlock()
		if full != nil {
			t := time.NewTimer(wait)
			select {
			case <-full:
			case <-t.C:
			}
			t.Stop()
		} else if gather {
			time.Sleep(b.gather)
		}
		b.mu.Lock()
		b.want, b.full = 0, nil
		calls := b.calls
		b.calls = nil
		if len(calls) == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		b.last = len(calls)
		b.mu.Unlock()
		b.sendBatch(calls)
	}
}

// sendBatch answers calls in one send. Calls whose context has ended are
// left out; the statements are bounded by the latest deadline among the
// others.
func (b *batcher[In, Out]) sendBatch(calls []*batchCall[In, Out]) {
	live := calls[:0]
	ins := make([]In, 0, len(calls))
	var latest time.Time
	for _, c := range calls {
		if c.ctx.Err() != nil {
			continue
		}
		live = append(live, c)
		ins = append(ins, c.in)
		if d, ok := c.ctx.Deadline(); ok && d.After(latest) {
			latest = d
		}
	}
	if len(live) == 0 {
		return
	}
	deadline := time.Now().Add(batchWait)
	if !latest.IsZero() && latest.Before(deadline) {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b.answer(ctx, live, ins)
}

// answer sends ins, the inputs of calls, and answers the calls. A failure
// for one input's sake (byInput) is sent again in halves, so that it
// reaches only the calls whose input fails alone.
func (b *batcher[In, Out]) answer(ctx context.Context, calls []*batchCall[In, Out], ins []In) {
	outs, err := b.send(ctx, ins)
	if err != nil && len(calls) > 1 && byInput(err) && ctx.Err() == nil {
		m := len(calls) / 2
		b.answer(ctx, calls[:m], ins[:m])
		b.answer(ctx, calls[m:], ins[m:])
		return
	}
	for i, c := range calls {
		if err != nil {
			c.res <- batchResult[Out]{err: err}
			continue
		}
		c.res <- batchResult[Out]{out: outs[i]}
	}
}

// byInput reports whether err is the server refusing a statement for the
// data it was given, which may be one input's alone: a data exception
// (SQLSTATE class 22), an integrity constraint (23), a trigger's or
// function's error (27, 2F, 38, 39, P0: RAISE EXCEPTION), a view's check
// option (44).
func byInput(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23", "27", "2F", "38", "39", "44", "P0":
		return true
	}
	return false
}
