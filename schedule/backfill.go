package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/store"
)

// BackfillOptions says which instants Scheduler.Backfill records.
type BackfillOptions struct {
	// From and To bound the range: the spec's instants in (From, To].
	// From must be before To.
	From, To time.Time
	// Max is the most instants recorded (at least 1): the oldest Max
	// instants the ledger lacks; BackfillResult.LeftOut counts the rest.
	// At most BackfillLimit unless AboveLimit is set.
	Max int
	// AboveLimit allows a Max above BackfillLimit: every instant recorded
	// is a pending run the schedule's live instants queue behind, and a
	// dry run holds them all in memory.
	AboveLimit bool
	// DryRun records nothing: the result lists the instants a backfill
	// would record now.
	DryRun bool
}

// BackfillResult is what Scheduler.Backfill recorded, or with DryRun would
// record.
type BackfillResult struct {
	// Instants are the instants recorded as pending runs of kind
	// "backfill" (with DryRun: that would be), oldest first.
	Instants []time.Time
	// Present counts the instants of the range already in the ledger
	// (run, skipped, triggered or backfilled before), left as they are.
	Present int
	// Taken counts the instants that were lacking when read but that a
	// concurrent backfill (or trigger) recorded first: this call left them
	// to it. Always 0 with DryRun.
	Taken int
	// LeftOut counts the instants lacking beyond Max: a later backfill of
	// the same range records them. Counting stops at maxLeftOut;
	// LeftOutMore then says more follow.
	LeftOut     int
	LeftOutMore bool
	// Until is the range's effective end: To, or, when To is later, the
	// schedule's frontier — the newest instant its scheduler has recorded
	// (or the start of its definition's life, if later). Instants after
	// the frontier belong to the scheduler, which records each as it comes
	// due and decides the ones it finds missed by the catch-up policy;
	// Clamped says To was cut back to it.
	Until   time.Time
	Clamped bool
	// Cut counts the spec's instants in (Until, To] that were cut with
	// the range and not recorded: a range reaching into the future
	// records only what lies before the frontier. Counting stops at
	// maxLeftOut; CutMore then says more follow. To run one of them now
	// (a test of "the 09:00 job"), use Scheduler.RunAt.
	Cut     int
	CutMore bool
}

// BackfillLimit is the largest BackfillOptions.Max that Backfill accepts
// without BackfillOptions.AboveLimit.
const BackfillLimit = 10_000

// maxLeftOut bounds how many instants beyond Max a backfill counts.
const maxLeftOut = 100_000

// Backfill records the instants of the schedule name's stored spec in
// (opts.From, opts.To] that the ledger lacks as pending runs of kind
// "backfill": the instances running the schedule run each once, oldest
// first, with its retry policy, like any run (a paused schedule's wait for
// Resume). Each instant is recorded once even when backfills overlap or
// run at the same time: the insert is ON CONFLICT DO NOTHING on the
// ledger's key (schedule, instant), and an instant that is there already —
// whatever its state — is left alone (Present, Taken). At most opts.Max
// instants are recorded, the oldest (LeftOut counts the others), in one
// statement: all or none. The range is cut back to the schedule's
// frontier (see BackfillResult.Until). With opts.DryRun nothing is
// written. Every instance is notified when runs were recorded.
//
// A backfill is not how to run an instant now: its runs are of kind
// "backfill" (never late nor missed), and a range reaching past the
// frontier is cut there — a nil error, with Clamped and Cut saying what
// was left out. A test that runs "today's 09:00 run" uses RunAt.
//
// Bad input returns an error naming the field (wrapping ErrInvalid);
// unknown name: ErrNotFound.
func (s *Scheduler) Backfill(ctx context.Context, name string, opts BackfillOptions) (BackfillResult, error) {
	var res BackfillResult
	switch {
	case name == "":
		return res, invalid("name", "must not be empty")
	case opts.From.IsZero():
		return res, invalid("BackfillOptions.From", "must be set")
	case opts.To.IsZero():
		return res, invalid("BackfillOptions.To", "must be set")
	case !opts.From.Before(opts.To):
		return res, invalid("BackfillOptions.From", fmt.Sprintf("must be before To (From %s, To %s)",
			opts.From.UTC().Format(time.RFC3339Nano), opts.To.UTC().Format(time.RFC3339Nano)))
	case opts.Max < 1:
		return res, invalid("BackfillOptions.Max", fmt.Sprintf("must be at least 1, got %d", opts.Max))
	case opts.Max > BackfillLimit && !opts.AboveLimit:
		return res, invalid("BackfillOptions.Max", fmt.Sprintf("%d is above the limit of %d: backfill in steps, or set AboveLimit", opts.Max, BackfillLimit))
	}
	st, err := loadSchedule(ctx, s.q, name)
	if err != nil {
		return res, err
	}
	frontier := st.startsAt
	if st.cursor.After(frontier) {
		frontier = st.cursor
	}
	res.Until = opts.To.UTC()
	if res.Until.After(frontier) {
		res.Until, res.Clamped = frontier, true
	}
	if res.Clamped {
		res.Cut, res.CutMore = count(st.spec, latest(res.Until, opts.From.UTC()), opts.To.UTC(), maxLeftOut)
	}
	lacking, err := s.lacking(ctx, st, opts.From.UTC(), opts.Max, &res)
	if err != nil {
		return res, err
	}
	if opts.DryRun || len(lacking) == 0 {
		res.Instants = lacking
		return res, nil
	}
	p := store.BackfillRunsParams{Schedule: name, Spec: st.def.Spec, TimeZone: st.def.TimeZone}
	for _, t := range lacking {
		p.Instants = append(p.Instants, ts(t))
	}
	var row store.BackfillRunsRow
	err = s.tx(ctx, func(q *store.Queries) error {
		var err error
		row, err = q.BackfillRuns(ctx, p)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("schedule: %q: backfill: %w", name, err)
	}
	if row.Matched == 0 {
		return res, fmt.Errorf("schedule: %q: backfill: its spec or time zone changed meanwhile (now not %s); nothing recorded", name, st.spec)
	}
	res.Instants = make([]time.Time, 0, len(row.Recorded))
	for _, t := range row.Recorded {
		res.Instants = append(res.Instants, tm(t))
	}
	res.Taken = len(lacking) - len(res.Instants)
	return res, nil
}

// count counts spec's instants in (from, to], stopping at limit (more:
// further instants follow).
func count(spec *cronSpec, from, to time.Time, limit int) (n int, more bool) {
	for from.Before(to) {
		batch, next := spec.between(from, to, min(recordChunk, limit-n+1))
		if n += len(batch); n > limit {
			return limit, true
		}
		if !next || len(batch) == 0 {
			break
		}
		from = batch[len(batch)-1]
	}
	return n, false
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// lacking returns the oldest max instants of st's spec in (from, res.Until]
// without a row, counting those present and those left out in res.
func (s *Scheduler) lacking(ctx context.Context, st *stored, from time.Time, limit int, res *BackfillResult) ([]time.Time, error) {
	var out []time.Time
	for from.Before(res.Until) {
		batch, more := st.spec.between(from, res.Until, recordChunk)
		if len(batch) == 0 {
			break
		}
		last := batch[len(batch)-1]
		rows, err := s.q.LedgerInstants(ctx, store.LedgerInstantsParams{Schedule: st.def.Name, After: ts(from), Upto: ts(last)})
		if err != nil {
			return nil, fmt.Errorf("schedule: %q: read runs: %w", st.def.Name, err)
		}
		have := make(map[time.Time]bool, len(rows))
		for _, r := range rows {
			have[tm(r)] = true
		}
		for _, t := range batch {
			switch {
			case have[t]:
				res.Present++
			case len(out) < limit:
				out = append(out, t)
			case res.LeftOut == maxLeftOut:
				res.LeftOutMore = true
				return out, nil
			default:
				res.LeftOut++
			}
		}
		if !more {
			break
		}
		from = last
	}
	return out, nil
}

// CancelBackfillResult is what Scheduler.CancelBackfill cancelled.
type CancelBackfillResult struct {
	// Cancelled counts the backfilled runs recorded skipped; First and
	// Last are the oldest and newest of their instants (zero when none).
	Cancelled   int
	First, Last time.Time
}

// CancelBackfill cancels the schedule name's backfill: its backfilled
// runs that have not started (pending) are recorded skipped with the
// reason "backfill cancelled by BY", so each instant keeps a decided
// outcome and a later backfill leaves it alone. A backfilled run already
// running or retrying is not touched: it finishes as any run. A run an
// instance claims while this call runs is not cancelled either (the
// update is a compare-and-swap on the run's state). Unknown name:
// ErrNotFound.
func (s *Scheduler) CancelBackfill(ctx context.Context, name, by string) (CancelBackfillResult, error) {
	var res CancelBackfillResult
	if name == "" {
		return res, invalid("name", "must not be empty")
	}
	if by == "" {
		by = "an operator"
	}
	var row store.CancelBackfillRow
	err := s.tx(ctx, func(q *store.Queries) error {
		var err error
		row, err = q.CancelBackfill(ctx, store.CancelBackfillParams{Schedule: name, Reason: "backfill cancelled by " + by})
		return err
	})
	if err != nil {
		return res, opErr("cancel backfill", name, err)
	}
	if row.Found == 0 {
		return res, opErr("cancel backfill", name, pgx.ErrNoRows)
	}
	res.Cancelled = int(row.Cancelled)
	if row.Cancelled > 0 {
		res.First, res.Last = tm(row.FirstInstant), tm(row.LastInstant)
	}
	return res, nil
}
