package claim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/listen"
	"github.com/pgclaim/pgclaim/internal/pgerr"
)

// channelPrefix and the table's oid name the channel on which a table's
// claimable rows are announced: by the trigger pgclaim_notify_on attaches
// (migration 00014) and by Notify.
const channelPrefix = "pgclaim_claim_"

// Notify announces that rows of table (a Table.Name: "table" or
// "schema.table", taken literally) entered state, so that the Workers
// claiming that table from that state wake at once rather than at their
// next poll. On a pgx.Tx it is sent when the transaction commits, and not
// at all if it rolls back; on a pool or a connection outside a transaction,
// at once. Identical announcements of one transaction reach the workers as
// one.
//
// A table with the trigger attached needs no Notify: every statement that
// puts rows in the state announces them, whoever writes it. Attach it once,
// as the table's owner, for example in the application's migration:
//
//	SELECT pgclaim_notify_on('items'::regclass, 'status', 'PAUSED');
//
// A missing announcement delays work, it never loses it: workers poll every
// WorkerConfig.PollInterval whatever they hear.
func Notify(ctx context.Context, db DBTX, table, state string) error {
	_, _, qname, err := parseName("Notify: table", table)
	if err != nil {
		return err
	}
	if state == "" {
		return invalid("Notify: state", "must not be empty")
	}
	if _, err := db.Exec(ctx, "SELECT pg_notify($1 || $2::regclass::oid::text, $3)", channelPrefix, qname, state); err != nil {
		return fmt.Errorf("claim: Notify %s: %w", table, pgerr.Explain(err))
	}
	return nil
}

// announcing returns the channel the table's claimable rows are announced
// on, and whether its trigger is attached for the column and From state.
func (c *Claimer[K]) announcing(ctx context.Context) (channel string, attached bool, err error) {
	t := c.c.t
	err = c.db.QueryRow(ctx, `
SELECT $1 || $2::regclass::oid::text,
       EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = $2::regclass AND tgname = 'pgclaim_notify_' || substr(md5($3 || '=' || $4), 1, 12) || '_ins')`,
		channelPrefix, t.qname, t.spec.State, c.c.from).Scan(&channel, &attached)
	return channel, attached, err
}

// attachStatement is the statement that attaches the trigger for c's table
// and From state.
func (c *Claimer[K]) attachStatement() string {
	t := c.c.t
	fn := "pgclaim_notify_on"
	if s := t.pgclaim.Name(); s != "" {
		fn = quote(s) + "." + fn
	}
	return fmt.Sprintf("SELECT %s(%s::regclass, %s, %s)", fn, quoteLiteral(t.qname), quoteLiteral(t.spec.State), quoteLiteral(c.c.from))
}

// retryClock wakes a worker when the rows it sent back with a backoff
// become claimable: it keeps the moments (at most retryClockCap; beyond
// that, the poll finds them) and one timer at the earliest.
type retryClock struct {
	mu    sync.Mutex
	at    []time.Time
	timer *time.Timer
	wake  func()
	done  bool
}

const retryClockCap = 10000

// add arranges a wake-up after d.
func (r *retryClock) add(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || len(r.at) >= retryClockCap {
		return
	}
	// A millisecond past the row's RetryAt, which the database set from
	// its clock when the statement ran, before this moment.
	r.at = append(r.at, time.Now().Add(d+time.Millisecond))
	r.arm()
}

// arm sets the timer at the earliest moment; r.mu is held.
func (r *retryClock) arm() {
	if len(r.at) == 0 {
		return
	}
	first := r.at[0]
	for _, t := range r.at[1:] {
		if t.Before(first) {
			first = t
		}
	}
	d := max(time.Until(first), 0)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.fire)
	} else {
		r.timer.Reset(d)
	}
}

func (r *retryClock) fire() {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	kept := r.at[:0]
	for _, t := range r.at {
		if t.After(now) {
			kept = append(kept, t)
		}
	}
	r.at = kept
	r.arm()
	r.mu.Unlock()
	r.wake()
}

// stop ends the clock.
func (r *retryClock) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	if r.timer != nil {
		r.timer.Stop()
	}
}

// subscribe subscribes w to the announcements of its table's claimable rows
// on the pool's listening session; nil when it polls only (PollOnly, a DBTX
// other than a pool, or a table whose channel cannot be found). attached
// reports whether the table's trigger announces rows in From.
func (w *Worker[K]) subscribe(ctx context.Context) (sub *listen.Sub, attached bool) {
	if w.cfg.PollOnly {
		return nil, false
	}
	c := w.c.c
	pool, ok := w.c.db.(*pgxpool.Pool)
	if !ok {
		c.report(ctx, Event{}, rec(slog.LevelInfo, "claim: worker: polls only: notifications need the claimer on a *pgxpool.Pool",
			slog.Duration("poll_interval", w.cfg.PollInterval)))
		return nil, false
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	channel, attached, err := w.c.announcing(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: cannot find the table's notification channel; polling only",
				slog.String("table", c.t.qname), slog.Any("error", err)))
		}
		return nil, false
	}
	return listen.Subscribe(pool, channel, listen.Options{Filter: c.from, One: true, Logger: c.log}), attached
}

// tellMode logs, once the listening session has settled, how w learns of
// claimable rows; it reports whether it did.
func (w *Worker[K]) tellMode(ctx context.Context, sub *listen.Sub, attached bool) bool {
	c := w.c.c
	attrs := []slog.Attr{slog.String("table", c.t.qname), slog.String("from", c.from), slog.Duration("poll_interval", w.cfg.PollInterval)}
	switch sub.Mode() {
	case listen.Listening:
		if attached {
			c.report(ctx, Event{}, rec(slog.LevelInfo, "claim: worker: claims when the table's trigger announces rows; polls as a safety net", attrs...))
		} else {
			c.report(ctx, Event{}, rec(slog.LevelInfo, "claim: worker: claims when claim.Notify announces rows; rows written without it wait for the poll: attach the table's trigger with "+w.c.attachStatement(), attrs...))
		}
	case listen.Polling:
		c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: worker: polls only: notifications cannot reach this process (a connection pooler in transaction mode)", attrs...))
	default:
		return false
	}
	return true
}
