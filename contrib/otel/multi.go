package pgclaimotel

import "context"

// EventHooks is what claim.Hooks, gate.Hooks and schedule.Hooks have in
// common: a receiver of the package's events E.
type EventHooks[E any] interface {
	Observe(ctx context.Context, e E)
}

// Multi hands every event to each of its hooks in turn, in order, with
// the same context; nil entries are passed over. It lets a service that
// already has hooks add an Observer's:
//
//	cfg.Hooks = pgclaimotel.Multi[claim.Event]{cfg.Hooks, obs.ClaimHooks()}
//
// Multi[claim.Event] is a claim.Hooks, Multi[gate.Event] a gate.Hooks and
// Multi[schedule.Event] a schedule.Hooks. Like every hook, each entry must
// not block.
type Multi[E any] []EventHooks[E]

// Observe calls Observe(ctx, e) of every non-nil hook of m.
func (m Multi[E]) Observe(ctx context.Context, e E) {
	for _, h := range m {
		if h != nil {
			h.Observe(ctx, e)
		}
	}
}
