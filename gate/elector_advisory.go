package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/internal/pgerr"
	"github.com/pgclaim/pgclaim/store"
)

// campaignAdvisory waits in pg_advisory_lock on a dedicated connection until
// the lock is granted, waits for the previous term to be closed (at most
// TTL), and opens a term. Connection failures while waiting are retried.
func (e *Elector) campaignAdvisory(ctx context.Context, deferEnd bool) (*term, error) {
	return e.stand(ctx, e.retryDelay(), func() (*term, error) { return e.tryAdvisory(ctx, deferEnd) })
}

// warnCollision looks, once a candidate has waited TTL for its lock,
// whether another election's open term has the same lock key (see
// ElectionKey), and warns for each: this election cannot lead until that
// leader's session ends.
func (e *Elector) warnCollision(ctx context.Context) {
	open, err := e.q.OpenAdvisoryTermsElsewhere(ctx, e.name)
	if err != nil {
		return
	}
	for _, o := range open {
		if _, k := electionKey(e.o.Schema, o.Election); k != e.key {
			continue
		}
		e.o.Logger.WarnContext(ctx, "gate: election lock key collides with another election's; this election cannot lead while that leader lives: rename one election or use ElectorConfig.Mechanism LeaseRow",
			"name", e.name, "holder", e.o.Holder, "colliding_election", o.Election, "colliding_holder", o.Holder, "colliding_fence", o.Term)
	}
}

// retryDelay is the pause before a failed advisory campaign is retried.
func (e *Elector) retryDelay() time.Duration {
	return min(e.o.TTL/4, time.Second)
}

// handoverPoll is how often a new lock holder looks whether the previous
// term was closed.
func (e *Elector) handoverPoll() time.Duration {
	return min(max(e.o.TTL/200, time.Millisecond), 5*time.Millisecond)
}

// oneTrip runs statements in one round trip each (pgx.QueryExecModeExec)
// on a session dedicated to one campaign and term: caching prepared
// statements there would only add a round trip to each first use, on the
// hand-over path.
type oneTrip struct{ conn *pgx.Conn }

func (o oneTrip) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return o.conn.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (o oneTrip) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return o.conn.Query(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (o oneTrip) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return o.conn.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (e *Elector) tryAdvisory(ctx context.Context, deferEnd bool) (*term, error) {
	var err error
	sess := e.takeNext()
	if sess == nil {
		if sess, err = (&lockcore.Sessions{Pool: e.pool, Schema: e.schema}).Get(ctx); err != nil {
			return nil, err
		}
	}
	q := store.New(e.schema.Wrap(oneTrip{sess.Conn}))
	keep := false
	defer func() {
		if !keep {
			sess.Close()
		}
	}()

	// Block in pg_advisory_lock. The statement runs without ctx's
	// cancellation so that an ended campaign can cancel the wait on the
	// server (a cancel request) instead of leaving a waiter queued behind
	// the leader.
	locked := make(chan error, 1)
	go func() {
		locked <- q.ElectionLock(context.WithoutCancel(ctx), store.ElectionLockParams{LockClass: e.class, LockKey: e.key})
	}()
	collide := time.NewTimer(e.o.TTL)
	defer collide.Stop()
wait:
	select {
	case <-collide.C:
		e.warnCollision(ctx)
		goto wait
	case err := <-locked:
		if err != nil {
			return nil, fmt.Errorf("gate: election %q: lock: %w", e.name, err)
		}
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = sess.Conn.PgConn().CancelRequest(cctx)
		cancel()
		select {
		case <-locked:
		case <-time.After(time.Second):
			// No answer to the cancel request: cut the socket (safe while
			// the statement reads from it) and let the statement fail.
			_ = sess.Conn.PgConn().Conn().Close()
			<-locked
		}
		return nil, ctx.Err() // closing the session drops a lock granted meanwhile
	}

	// The lock is ours: the previous leader's session has ended. Start a
	// term once the previous one is closed, so terms never overlap: a live
	// leader closes its term as soon as it sees its session end; one that
	// has not within TTL crashed or is cut off, and has stepped down by
	// then, so its term is superseded. The statement is not cancelled with
	// ctx: a term recorded must be known, or it would stay open until the
	// next leader supersedes it.
	got := time.Now()
	var (
		row    store.StartAdvisoryTermRow
		sent   time.Time
		warned bool
		// The old leader closes its term a round trip after it sees its
		// session end, about when the server grants the lock here: look
		// again soon, then less often.
		poll = min(time.Millisecond, e.handoverPoll())
	)
	for {
		supersede := time.Since(got) >= e.o.TTL
		if supersede && !warned {
			warned = true
			open, _ := q.OpenTerm(ctx, e.name)
			e.o.Logger.WarnContext(ctx, "gate: previous leader did not close its term; superseding it",
				"name", e.name, "holder", e.o.Holder, "previous_holder", open.Holder, "previous_fence", open.Term)
		}
		sctx, cancel := releaseCtx(ctx)
		sent = time.Now()
		row, err = q.StartAdvisoryTerm(sctx, store.StartAdvisoryTermParams{Election: e.name, Holder: e.o.Holder, Supersede: supersede})
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("gate: election %q: start term: %w", e.name, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(poll):
		}
		poll = min(2*poll, e.handoverPoll())
	}
	t := e.newTerm(row.Term, sent, deferEnd)
	t.sess, t.sq = sess, q
	keep = true
	return t, nil
}

// lossErr is the ErrLockLost for a loss the term's keeper reported.
func (t *term) lossErr(why error) error {
	e := t.e
	switch {
	case t.sess != nil && errors.Is(why, lockcore.ErrExpired):
		return fmt.Errorf("%w: election %q: session not confirmed for %v", ErrLockLost, e.name, e.validity())
	case t.sess != nil:
		return fmt.Errorf("%w: election %q: session lost: %w", ErrLockLost, e.name, why)
	case errors.Is(why, lockcore.ErrExpired):
		return fmt.Errorf("%w: election %q: lease not renewed for %v", ErrLockLost, e.name, e.validity())
	case pgerr.Permanent(why):
		return fmt.Errorf("%w: election %q: the server refused renewing term %d: %w", ErrLockLost, e.name, t.fence, pgerr.Explain(why))
	default:
		return fmt.Errorf("%w: election %q: term %d expired or was closed", ErrLockLost, e.name, t.fence)
	}
}
