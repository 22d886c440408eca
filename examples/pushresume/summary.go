package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
)

// check reads the outcome from the database and records every invariant
// that does not hold in res.Failures.
func (o *orchestrator) check(ctx context.Context, res *demoResult) error {
	var err error
	if res.States, err = o.states(ctx); err != nil {
		return err
	}
	for _, n := range res.States {
		res.Total += n
	}
	sends, err := o.q.CountSends(ctx)
	if err != nil {
		return err
	}
	res.Sends, res.Pushes = sends.Sends, sends.Pushes
	if res.Duplicates, err = o.q.CountDuplicateSends(ctx); err != nil {
		return err
	}
	if res.Early, err = o.q.CountSentBefore(ctx, res.FireAt); err != nil {
		return err
	}
	if res.Odd, err = o.q.CountInconsistent(ctx); err != nil {
		return err
	}
	if res.Runs, err = o.q.ScheduleRuns(ctx, job); err != nil {
		return err
	}
	if res.FailReasons, err = o.q.FailReasons(ctx); err != nil {
		return err
	}
	by, err := o.q.SentByInstance(ctx)
	if err != nil {
		return err
	}
	res.SentBy = map[string]int64{}
	for _, r := range by {
		res.SentBy[r.Instance] = r.N
	}

	fail := func(format string, args ...any) { res.Failures = append(res.Failures, fmt.Sprintf(format, args...)) }
	if res.Duplicates != 0 {
		fail("%d pushes were sent more than once", res.Duplicates)
	}
	if res.Early != 0 {
		fail("%d pushes were sent before 09:00", res.Early)
	}
	if n := res.States["PROCESSING"]; n != 0 {
		fail("%d rows were left PROCESSING", n)
	}
	if n := res.States["PAUSED"]; n != 0 {
		fail("%d pushes were never resumed", n)
	}
	if n := res.States["READY"]; n != 0 {
		fail("%d pushes were resumed and never sent", n)
	}
	if res.Sends != res.States["SENT"] {
		fail("%d sends for %d SENT rows", res.Sends, res.States["SENT"])
	}
	if odd := res.Odd; odd.SentWithoutOneSend+odd.SendsOfUnsent+odd.SendsWithStaleFence != 0 {
		fail("state and sends disagree: %d SENT rows without exactly one send, %d sends of rows not SENT, %d sends under a stale fencing token",
			odd.SentWithoutOneSend, odd.SendsOfUnsent, odd.SendsWithStaleFence)
	}
	n := 0
	for i, r := range res.Runs {
		if r.Instant.Equal(res.FireAt) {
			n++
			res.Run = &res.Runs[i]
		}
	}
	switch r := res.Run; {
	case n != 1:
		fail("the ledger holds %d rows for the 09:00 instant, not 1", n)
	case r.State != "succeeded":
		fail("the 09:00 run ended %s, not succeeded (%s)", r.State, deref(r.Reason))
	case res.Killed != nil && (r.Attempt < 2 || deref(r.Holder) == res.Killed.holder):
		fail("the 09:00 run succeeded at attempt %d under %s; want a later attempt than the killed %s's", r.Attempt, deref(r.Holder), res.Killed.holder)
	}
	res.OK = len(res.Failures) == 0
	return nil
}

// procRow is one instance's line in the summary.
type procRow struct {
	label, role             string
	pid                     int
	attempts, completed     int
	resumed, claimed, sent  int
	sweptFailed, sweptRetry int
}

func procRows(res *demoResult) []procRow {
	var out []procRow
	for _, p := range res.Procs {
		n := p.seen
		if p.stopped != nil {
			n = *p.stopped
		}
		r := procRow{label: p.label, pid: p.pid, attempts: n.Attempts, completed: n.Completed,
			resumed: n.Resumed, claimed: n.Claimed, sent: int(res.SentBy[p.holder]),
			sweptFailed: n.SweptFailed, sweptRetry: n.SweptRetry}
		switch {
		case p.killed:
			// Everything its worker claimed either committed as SENT or
			// was swept.
			r.claimed = r.sent + p.seen.Claimed
			r.role = fmt.Sprintf("ran attempt %d, SIGKILLed", p.attempt)
		case n.Completed > 0 && p.attempt > 1:
			r.role = fmt.Sprintf("completed the run as attempt %d", p.attempt)
		case n.Completed > 0:
			r.role = "ran the 09:00 run"
		case strings.Contains(p.label, "#"):
			r.role = "restarted, nothing to catch up"
		default:
			r.role = "standing by"
		}
		out = append(out, r)
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// summary prints the per-instance table, the overall figures and the verdict.
func (o *orchestrator) summary(res *demoResult) {
	w := o.out
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "instance\tpid\trole\tattempts\trows resumed\trows claimed\tpushes sent\trows swept")
	for _, r := range procRows(res) {
		var swept []string
		if r.sweptFailed > 0 {
			swept = append(swept, fmt.Sprintf("%d→FAILED", r.sweptFailed))
		}
		if r.sweptRetry > 0 {
			swept = append(swept, fmt.Sprintf("%d→READY", r.sweptRetry))
		}
		if len(swept) == 0 {
			swept = []string{"0"}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", r.label, r.pid, r.role, r.attempts, r.resumed, r.claimed, r.sent, strings.Join(swept, ", "))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)

	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAILED"
	}
	seeded := res.Total - int64(o.cfg.Stuck)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "pushes sent\t%d of %d paused\t%s\n", res.Pushes, seeded, mark(res.Pushes == seeded))
	fmt.Fprintf(tw, "duplicate sends\t%d\t%s (must be 0)\n", res.Duplicates, mark(res.Duplicates == 0))
	fmt.Fprintf(tw, "pushes sent before 09:00\t%d\t%s (must be 0)\n", res.Early, mark(res.Early == 0))
	fmt.Fprintf(tw, "rows left PROCESSING\t%d\t%s (must be 0)\n", res.States["PROCESSING"], mark(res.States["PROCESSING"] == 0))
	fmt.Fprintf(tw, "rows left PAUSED\t%d\t%s (must be 0)\n", res.States["PAUSED"], mark(res.States["PAUSED"] == 0))
	fmt.Fprintf(tw, "rows left READY\t%d\t%s (must be 0)\n", res.States["READY"], mark(res.States["READY"] == 0))
	odd := res.Odd.SentWithoutOneSend + res.Odd.SendsOfUnsent + res.Odd.SendsWithStaleFence
	fmt.Fprintf(tw, "sends out of step with states\t%d\t%s (must be 0)\n", odd, mark(odd == 0))
	// FAILED is expected for the rows seeded as stuck since yesterday.
	if r := res.FailReasons; len(r) == 1 {
		fmt.Fprintf(tw, "rows FAILED\t%d\t%d seeded as stuck since yesterday; reason: %s\n", r[0].N, o.cfg.Stuck, r[0].Reason)
	} else {
		fmt.Fprintf(tw, "rows FAILED\t%d\t(%d seeded as stuck since yesterday)\n", res.States["FAILED"], o.cfg.Stuck)
		for _, r := range r {
			fmt.Fprintf(tw, "\t%d\t%s\n", r.N, r.Reason)
		}
	}
	if r := res.Run; r != nil {
		fence := int64(0)
		if r.Fence != nil {
			fence = *r.Fence
		}
		note := ""
		if k := res.Killed; k != nil && r.Attempt > 1 {
			note = fmt.Sprintf(" (attempt %d, fence %d, died with %s)", k.attempt, k.fence, k.holder)
		}
		fmt.Fprintf(tw, "ledger, 09:00 instant\t1 row\t%s at attempt %d, fence %d, by %s%s\n", r.State, r.Attempt, fence, deref(r.Holder), note)
	}
	if len(res.PickupBy) > 0 {
		var by []string
		for _, p := range res.Procs {
			if d, ok := res.PickupBy[p.label]; ok {
				by = append(by, p.label+" "+msText(d))
			}
		}
		fmt.Fprintf(tw, "pickup\t%s\tresume's COMMIT sent → first push started (%s), as measured in this run; unannounced, up to the workers' poll: %s\n",
			msText(res.Pickup), strings.Join(by, ", "), o.cfg.Instance.WorkerPoll)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	if res.OK {
		fmt.Fprintln(w, "OK: every paused push was sent exactly once, and nothing was left stuck.")
		return
	}
	fmt.Fprintln(w, "FAILED:")
	for _, f := range res.Failures {
		fmt.Fprintln(w, "  - "+f)
	}
}
