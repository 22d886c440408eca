package claim

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// EventKind says what an Event reports.
type EventKind int

// The kinds of Event.
const (
	// EventClaimed: rows moved from From to To (Claim, ClaimBatch, and the
	// Worker's batches). State is To.
	EventClaimed EventKind = iota + 1
	// EventNotClaimed: Claim found its row not in From (another holder
	// won, or there is no such row).
	EventNotClaimed
	// EventFinished: claimed rows moved to State (Finish, FinishBatch, and
	// the Worker's finishes: Done on success, Failed or Retry.State on failure,
	// with the work's error in Err).
	EventFinished
	// EventReleased: claimed rows given back to From (Release, and the
	// Worker's releases on shutdown). State is From.
	EventReleased
	// EventLost: claims found no longer held by a finish, extend or
	// release, or by the Worker's heartbeat; nothing was changed. The
	// heartbeat leaves a claim whose finish is under way to that finish,
	// so a claim is reported once.
	EventLost
	// EventSwept: stale rows moved to State by a Sweeper.
	EventSwept
)

// String returns the kind's name: "claimed", "not claimed", "finished",
// "released", "lost" or "swept".
func (k EventKind) String() string {
	switch k {
	case EventClaimed:
		return "claimed"
	case EventNotClaimed:
		return "not claimed"
	case EventFinished:
		return "finished"
	case EventReleased:
		return "released"
	case EventLost:
		return "lost"
	case EventSwept:
		return "swept"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one observation reported to Hooks: one statement and the rows
// it moved. Events report statements, not commits: rows finished inside a
// transaction that then rolls back were reported all the same.
type Event struct {
	Kind     EventKind
	Table    string        // the table, quoted as in SQL
	Holder   string        // the claimer's Config.Holder
	State    string        // the state the rows moved to ("" for EventNotClaimed and EventLost)
	Rows     int           // how many rows (claims, for EventLost; 1 for EventNotClaimed)
	Duration time.Duration // how long the statement took
	Err      error         // EventFinished by a Worker after failed work: the work's error
	// Reason is set for EventSwept: why the rows were stale,
	// SweptLeaseExpired or SweptClaimedTooLong (one event per state and
	// reason).
	Reason string
}

// The reasons of an EventSwept (Event.Reason).
const (
	// SweptLeaseExpired: the rows' lease (Table.LeaseUntil) had passed.
	SweptLeaseExpired = "lease expired"
	// SweptClaimedTooLong: the rows, claimed without a lease, were
	// claimed longer than SweeperConfig.StaleAfter ago.
	SweptClaimedTooLong = "claimed too long"
)

// Hooks receives events for metrics and tracing. Observe is called from the
// goroutine that ran the statement, possibly from several at once, and must
// not block. ctx is the context of the call that ran the statement (for the
// Worker's claims, heartbeats, finishes and releases, one carrying the values
// of the context passed to Worker.Run or Worker.Drain), so a tracer finds
// the caller's span there and a logger the caller's values.
type Hooks interface {
	Observe(ctx context.Context, e Event)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f HooksFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// record is one log record: its level, message and attributes.
type record struct {
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// rec returns the log record of msg at level with attrs.
func rec(level slog.Level, msg string, attrs ...slog.Attr) record {
	return record{level: level, msg: msg, attrs: attrs}
}

// report is the package's one path for telling what happened, used by the
// claimer and by the workers and sweepers built on it: it hands e to the
// claimer's Hooks (when e.Rows is positive, filling in the table and the
// holder), then writes logs, the records that go with it, to the claimer's
// Logger (Config.Logger); both with ctx, the context of the call that ran
// the statement (see Hooks). A record that goes with no statement (a
// failure, a warning) comes with the zero Event.
func (c *core) report(ctx context.Context, e Event, logs ...record) {
	if c.hooks != nil && e.Rows > 0 {
		e.Table, e.Holder = c.t.qname, c.holder
		c.hooks.Observe(ctx, e)
	}
	for _, r := range logs {
		c.log.LogAttrs(ctx, r.level, r.msg, r.attrs...)
	}
}
