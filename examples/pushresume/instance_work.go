package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/claim"
	"github.com/pgclaim/pgclaim/examples/pushresume/db"
	"github.com/pgclaim/pgclaim/schedule"
)

// observe reports the scheduler's events to the demo.
func (in *instance) observe(_ context.Context, e schedule.Event) {
	ev := event{FireAt: e.Instant, How: e.RunKind, Attempt: e.Attempt, Fence: e.Fence, State: e.State, Msg: e.Reason}
	switch e.Kind {
	case schedule.EventStarted:
		ev.Ev = evAttempt
		in.count(func(n *counters) { n.Attempts++ })
	case schedule.EventFinished:
		ev.Ev = evFinished
		if e.Err != nil && ev.Msg == "" {
			ev.Msg = e.Err.Error()
		}
		if e.State == "succeeded" {
			in.count(func(n *counters) { n.Completed++ })
		}
	case schedule.EventTakenOver:
		ev.Ev = evTakenOver
	case schedule.EventLost:
		ev.Ev, ev.Msg = evLost, e.Err.Error()
	case schedule.EventSkipped, schedule.EventMissed:
		ev.Ev, ev.Msg = evSkipped, e.Kind.String()+": "+e.Reason
	case schedule.EventFollowed:
		ev.Ev, ev.Msg = evError, "registration: "+e.Reason
	default:
		return
	}
	in.rep.emit(ev)
}

// send "sends" one push: the provider call takes SendDelay, and the hand-over
// is recorded in sent_pushes through tx, the transaction the worker then
// finishes the claim in (PROCESSING → SENT, fenced by the claim's token). If
// the claim was swept meanwhile, the finish fails and the send rolls back.
func (in *instance) send(ctx context.Context, tx pgx.Tx, c claim.Claim[int64]) error {
	in.rep.emit(event{Ev: evSending, ID: c.Key, Fence: c.Fence, At: time.Now()})
	if in.cfg.SendDelay > 0 {
		t := time.NewTimer(in.cfg.SendDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	return in.q.WithTx(tx).RecordSend(ctx, db.RecordSendParams{PushID: c.Key, Fence: c.Fence, Instance: in.holder})
}

// resume is the schedule's job: one attempt at resuming the pushes paused
// before run.Instant. It moves them PAUSED → READY in one statement, whose
// commit the table's trigger announces to every instance's worker; the
// workers send them. The attempt then waits until none of those rows is
// READY or PROCESSING, sweeping meanwhile, so that the instant is recorded
// succeeded once its pushes are sent (or failed for good): a claim whose
// holder died is PROCESSING until its lease runs out, then swept back to
// READY and sent by a live worker. A later attempt (its runner died)
// resumes what is still PAUSED, nothing once an earlier resume committed,
// and waits the same way; rows already SENT are never sent again.
func (in *instance) resume(ctx context.Context, run schedule.Run) error {
	how := fmt.Sprintf("attempt %d", run.Attempt)
	// The resume in a transaction of its own, so that the demo knows when
	// its COMMIT went out: the trigger's announcement is delivered with the
	// commit, and the pickup is measured from here.
	tx, err := in.pool.Begin(ctx)
	if err != nil {
		return err
	}
	n, err := in.q.WithTx(tx).ResumePaused(ctx, run.Instant)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	commit := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	in.count(func(c *counters) { c.Resumed += int(n) })
	in.rep.emit(event{Ev: evResumed, How: how, Attempt: run.Attempt, N: int(n), At: commit, Took: time.Since(commit)})
	waiting := false
	for {
		if _, err := in.sweep(ctx, how); err != nil {
			return err
		}
		open, err := in.q.CountOpen(ctx, run.Instant)
		if err != nil {
			return err
		}
		if open.Paused+open.Ready+open.Processing == 0 {
			return nil
		}
		if !waiting {
			waiting = true
			by, err := in.q.ProcessingByHolder(ctx, run.Instant)
			if err != nil {
				return err
			}
			e := event{Ev: evWaiting, Attempt: run.Attempt, N: int(open.Ready), By: map[string]int{}}
			for _, r := range by {
				e.By[r.Holder] = int(r.N)
			}
			in.rep.emit(e)
		}
		t := time.NewTimer(in.cfg.SweepEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}

// sweep runs the sweeper and reports what moved.
func (in *instance) sweep(ctx context.Context, rule string) (retried int, err error) {
	to := map[string]int{}
	by := map[string]int{}
	total := 0
	swept, err := in.sweeper.Sweep(ctx)
	for _, r := range swept {
		to[r.State]++
		by[r.ClaimedBy]++
		total++
	}
	if err != nil {
		return 0, err
	}
	in.count(func(n *counters) {
		n.SweptFailed += to["FAILED"]
		n.SweptRetry += to["READY"]
	})
	if total > 0 || rule == ruleStartup {
		in.rep.emit(event{Ev: evSwept, Rule: rule, N: total, To: to, By: by})
	}
	return to["READY"], nil
}
