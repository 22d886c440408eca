package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/store"
)

// campaignLease tries every RetryInterval to open a term leased for TTL,
// which succeeds once no unexpired term is open.
func (e *Elector) campaignLease(ctx context.Context, deferEnd bool) (*term, error) {
	return e.stand(ctx, e.o.RetryInterval, func() (*term, error) {
		// Not cancelled with ctx: a term recorded must be known, or it
		// would block the election until its lease runs out.
		sctx, cancel := releaseCtx(ctx)
		sent := time.Now()
		row, err := e.q.StartLeaseTerm(sctx, store.StartLeaseTermParams{
			Election: e.name, Holder: e.o.Holder, TtlUs: e.o.TTL.Microseconds(),
		})
		cancel()
		if err != nil {
			return nil, err
		}
		if err := e.stampStart(ctx, row.Term); err != nil {
			return nil, err
		}
		if !time.Now().Before(sent.Add(e.validity())) {
			// Confirmed too late to lead for any time: a standby may
			// take the lease over before the watcher first looks.
			e.closeUnstarted(ctx, row.Term)
			return nil, fmt.Errorf("gate: election %q: term %d confirmed after its validity (%v) ran out", e.name, row.Term, e.validity())
		}
		return e.newTerm(row.Term, sent, deferEnd), nil
	})
}

// stampStart records when a new lease term is certainly in force. A term
// that ended meanwhile, or whose lease ran out before the stamp (the
// candidate stalled longer than TTL), is lost: pgx.ErrNoRows, and its row is
// closed (as expired) if still open. So is a term whose fence is below that
// of a term the election had meanwhile (the candidate stalled inside
// StartLeaseTerm): the stamp deletes its row. A term whose stamp cannot be
// written is closed again.
func (e *Elector) stampStart(ctx context.Context, term int64) error {
	sctx, cancel := releaseCtx(ctx)
	defer cancel()
	_, err := e.q.StampTermStart(sctx, store.StampTermStartParams{Election: e.name, Term: term})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		e.closeUnstarted(ctx, term)
	case err != nil:
		_ = e.endTermRetrying(sctx, store.EndTermParams{Election: e.name, Term: term, Reason: reasonResigned})
	}
	return err
}

// closeUnstarted closes a term this instance opened but does not lead, with
// one try: when it fails, the next StartLeaseTerm of any candidate closes
// the row once its lease has run out.
func (e *Elector) closeUnstarted(ctx context.Context, term int64) {
	cctx, cancel := releaseCtx(ctx)
	defer cancel()
	_, _ = e.q.EndTerm(cctx, store.EndTermParams{Election: e.name, Term: term, Reason: reasonLost})
}

// renewLease starts the keeper of lease term t: it renews the term's lease
// every TTL/4 (TTL/16 after a failed renewal), each renewal scoped to this
// term, and reports a loss when a renewal finds the term ended or expired,
// or when no renewal succeeded for 3/4 TTL.
func (e *Elector) renewLease(t *term, onLost func(error)) *lockcore.Keeper {
	return lockcore.Renew(t.obsCtx, lockcore.RenewConfig{
		Every: e.checkEvery(), Retry: e.checkEvery() / 4, Validity: t.valid,
		Renew: func(ctx context.Context) (bool, error) {
			_, err := e.q.RenewTerm(ctx, store.RenewTermParams{Election: e.name, Term: t.fence, TtlUs: e.o.TTL.Microseconds()})
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		},
		OnFail: func(err error) {
			// Soon again: the pool's next connection may well work.
			e.o.Logger.WarnContext(t.obsCtx, "gate: lease renewal failed", "name", e.name, "holder", e.o.Holder, "fence", t.fence, "error", err.Error())
		},
	}, onLost)
}
