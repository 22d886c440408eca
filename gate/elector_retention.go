package gate

// Retention of terms: a leading Elector deletes its election's terms that
// ended longer ago than ElectorConfig.Retention, as a Gate deletes old
// ticks: when it starts leading (at most every 10 minutes for one
// Elector) and every 10 minutes while it leads, each statement bounded in
// time, so an election that changes hands often does not grow
// pgclaim_terms forever.

import (
	"context"
	"fmt"
	"time"

	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// KeepTerms, as ElectorConfig.Retention, keeps every term: nothing is
// deleted but by Elector.Prune.
const KeepTerms time.Duration = -1

// checkTermRetention validates ElectorConfig.Retention.
func checkTermRetention(r time.Duration) error {
	switch {
	case r == 0 || r == KeepTerms:
		return nil
	case r < 0:
		return invalid("ElectorConfig.Retention", fmt.Sprintf("%s is negative: use gate.KeepTerms to keep every term", r))
	case r < time.Hour:
		return invalid("ElectorConfig.Retention", fmt.Sprintf("%s is shorter than an hour: keep terms long enough to look at them (or gate.KeepTerms)", r))
	}
	return nil
}

// retainTerms deletes old terms while t leads: at once, unless this
// Elector did less than retainEvery ago, then every retainEvery
// (jittered) until the leadership ends.
func (e *Elector) retainTerms(t *term) {
	if e.o.Retention <= 0 {
		return
	}
	for {
		if next := e.nextRetain.Load(); time.Now().UnixNano() >= next && e.nextRetain.CompareAndSwap(next, time.Now().Add(retainEvery).UnixNano()) {
			e.retainTermsOnce(t.obsCtx)
		}
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(jittered(retainEvery)):
		}
	}
}

// retainTermsOnce deletes the election's terms that ended longer ago than
// the retention, in one statement bounded by retainStatement, and logs how
// many.
func (e *Elector) retainTermsOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, retainStatement)
	defer cancel()
	n, err := e.q.PruneTerms(ctx, store.PruneTermsParams{Election: e.name, OlderThanUs: e.o.Retention.Microseconds()})
	switch {
	case err != nil && !pgerr.Refused(err):
		e.o.Logger.WarnContext(ctx, "gate: delete old terms (retention); trying again at the next pass", "name", e.name, "error", pgerr.Explain(err))
	case n > 0:
		e.o.Logger.InfoContext(ctx, "gate: old terms deleted (retention)", "name", e.name, "deleted", n, "older_than", e.o.Retention.String())
	}
}
