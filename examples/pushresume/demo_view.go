package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// say prints one line of the live view.
func (o *orchestrator) say(who, format string, args ...any) {
	fmt.Fprintf(o.out, "%6.2fs  %-9s %s\n", time.Since(o.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// handle applies one event to its proc and prints it in the live view.
func (o *orchestrator) handle(pe procEvent) error {
	p, e := pe.p, pe.e
	if pe.exit {
		p.exited, p.err = true, pe.err
		if !p.killed && p.stopped == nil {
			return fmt.Errorf("%s: %w: %v", p.label, errExited, pe.err)
		}
		return nil
	}
	if e.Holder != "" {
		p.holder = e.Holder
	}
	switch e.Ev {
	case evReady:
		p.ready = true
		o.say(p.label, "claim worker and scheduler running (pid %d)", e.PID)
	case evWorker:
		o.say(p.label, "worker: %s (its poll: every %s)", e.Msg, o.cfg.Instance.WorkerPoll)
	case evSwept:
		p.seen.SweptFailed += e.To["FAILED"]
		p.seen.SweptRetry += e.To["READY"]
		p.swept += e.N
		for holder, n := range e.By {
			for _, q := range o.procs {
				if q.holder == holder && q.killed {
					q.seen.Claimed += n // claims it held when it died
				}
			}
		}
		o.say(p.label, "%s", sweptText(e))
	case evRegistered:
		p.registered = true
		o.say(p.label, "%s", e.Msg)
	case evLedger:
		o.say(p.label, "ledger: the newest run of %s, %s, is %s at attempt %d (fence %d, %s)",
			job, o.instantText(e.FireAt), e.State, e.Attempt, e.Fence, e.Msg)
	case evTakenOver:
		if e.State == "failed" {
			o.say(p.label, "%s: recorded failed, no attempts left (%s)", o.instantText(e.FireAt), e.Msg)
			break
		}
		o.say(p.label, "%s: took the run over (%s)", o.instantText(e.FireAt), e.Msg)
	case evAttempt:
		p.attempt, p.fence, p.finished = e.Attempt, e.Fence, ""
		p.seen.Attempts++
		o.say(p.label, "%s: attempt %d is mine (fence %d) → resuming the pushes paused before it", o.instantText(e.FireAt), e.Attempt, e.Fence)
	case evWaiting:
		o.say(p.label, "attempt %d: %s", e.Attempt, o.waitingText(e))
	case evFinished:
		p.finished = e.State
		if e.State == "succeeded" {
			p.seen.Completed++
		}
		text := fmt.Sprintf("%s: attempt %d (fence %d) ended %s", o.instantText(e.FireAt), e.Attempt, e.Fence, e.State)
		if e.Msg != "" {
			text += ": " + short(e.Msg)
		}
		o.say(p.label, "%s", text)
	case evLost, evSkipped:
		o.say(p.label, "%s: %s", o.instantText(e.FireAt), short(e.Msg))
	case evSending:
		p.sending++
		if p.firstSend.IsZero() {
			p.firstSend = e.At
			o.pickups()
		}
	case evResumed:
		p.seen.Resumed += e.N
		if e.N == 0 {
			o.say(p.label, "%s: nothing left PAUSED (an earlier attempt's resume committed)", e.How)
			break
		}
		o.say(p.label, "%s: resumed %s in one statement (PAUSED → READY); the table's trigger announces them with its commit (the COMMIT: %s)",
			e.How, plural(e.N, "push"), msText(e.Took))
		if o.resumedAt.IsZero() {
			o.resumedAt = e.At
			// The workers the announcement reached: those of the
			// instances running now. One started later finds its rows
			// by its first claim, not by the announcement.
			for _, q := range o.procs {
				q.atResume = q.ready && !q.killed && !q.exited
			}
			o.pickups()
		}
	case evError:
		o.say(p.label, "ERROR %s", short(e.Msg))
	case evStopped:
		p.stopped = e.Stats
	}
	if o.onEvent != nil {
		o.onEvent(p, e)
	}
	return nil
}

// pickups prints, for each instance running at the resume whose first push
// is known and not yet shown, how soon after the resume's COMMIT it started. An instance's
// events arrive in order, but two instances' interleave: either the resume
// or a first push may come first.
func (o *orchestrator) pickups() {
	if o.resumedAt.IsZero() {
		return
	}
	for _, p := range o.procs {
		if !p.atResume || p.firstSend.IsZero() || p.pickupShown {
			continue
		}
		p.pickupShown = true
		o.say(p.label, "worker: first push started %s after the resume's COMMIT was sent", msText(p.firstSend.Sub(o.resumedAt)))
	}
}

// waitingText describes what an attempt waits for: the instant's rows
// still READY, and those PROCESSING per holder, a killed one's marked.
func (o *orchestrator) waitingText(e event) string {
	parts := []string{fmt.Sprintf("%d READY", e.N)}
	dead := false
	for _, holder := range slices.Sorted(maps.Keys(e.By)) {
		part := fmt.Sprintf("%d PROCESSING under %s", e.By[holder], holder)
		for _, q := range o.procs {
			if q.holder == holder && q.killed {
				part += " (killed)"
				dead = true
			}
		}
		parts = append(parts, part)
	}
	text := "waiting for the instant's pushes to be sent: " + strings.Join(parts, ", ")
	if dead {
		text += " → a killed instance's claims are swept back to READY once their lease runs out"
	}
	return text
}

// msText prints d in milliseconds.
func msText(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// instantText names an instant of the schedule: the demo's 09:00, or the
// instant itself.
func (o *orchestrator) instantText(t time.Time) string {
	if !o.fireAt.IsZero() && t.Equal(o.fireAt) {
		return "09:00 (" + t.UTC().Format("15:04:05Z") + ")"
	}
	return t.UTC().Format(time.RFC3339)
}

func sweptText(e event) string {
	if e.N == 0 {
		return e.Rule + " sweep: nothing stuck"
	}
	var to []string
	for _, s := range slices.Sorted(maps.Keys(e.To)) {
		what := s
		if s == "READY" {
			what = "READY (announced: claimed again)"
		}
		to = append(to, fmt.Sprintf("%d → %s", e.To[s], what))
	}
	by := slices.Sorted(maps.Keys(e.By))
	return fmt.Sprintf("%s sweep: %s stuck under %s: %s", e.Rule, plural(e.N, "row"), strings.Join(by, ", "), strings.Join(to, ", "))
}

// plural returns "1 row", "2 rows", "1 push", "2 pushes".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "sh") {
		return fmt.Sprintf("%d %ses", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func durationText(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return d.String()
}
