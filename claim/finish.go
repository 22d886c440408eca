package claim

// Finishing claims: one or a batch, fenced, with a reason and a retry time
// where the table has their columns.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// lost is the log record of a claim op found no longer held.
func (c *Claimer[K]) lost(op string, cl Claim[K]) record {
	return rec(slog.LevelWarn, "claim: claim lost", slog.String("op", op), slog.String("table", c.c.t.qname),
		slog.Any("key", cl.Key), slog.Int64("fence", cl.Fence))
}

// Finish moves the claimed row from To to state, only if it is still in To
// with this claim's token. Otherwise it returns ErrLost and changes nothing.
// It needs Table.Fence; state must not be empty or equal To.
func (c *Claimer[K]) Finish(ctx context.Context, cl Claim[K], state string) error {
	if err := c.checkState("Finish", state); err != nil {
		return err
	}
	return c.finish(ctx, "Finish", cl, Event{Kind: EventFinished, State: state}, nil, &c.c.sqlFinish[0][0], cl.Key, cl.Fence, state)
}

// maxReason is the most bytes of an error's text a worker records in
// Table.Reason.
const maxReason = 2000

// finishWith is Finish on behalf of a worker whose work ended with cause
// (nil on success). It also sets Table.Reason, when the table has that
// column, to the text of cause (NULL when nil), cut at maxReason bytes on a
// character boundary; and, when retryIn is positive, Table.RetryAt to
// database time plus retryIn. logs are the records that go with the move
// (see finish).
func (c *Claimer[K]) finishWith(ctx context.Context, cl Claim[K], state string, cause error, retryIn time.Duration, logs ...record) error {
	if err := c.checkState("Finish", state); err != nil {
		return err
	}
	var reason *string
	r, d := 0, 0
	if c.c.t.reason != "" {
		if cause != nil {
			text := cause.Error()
			if len(text) > maxReason {
				text = strings.ToValidUTF8(text[:maxReason], "")
			}
			reason = &text
		}
		r = 1
	}
	if retryIn > 0 && c.c.t.retryAt != "" {
		d = 1
	}
	return c.finish(ctx, "Finish", cl, Event{Kind: EventFinished, State: state, Err: cause}, logs, &c.c.sqlFinish[r][d],
		cl.Key, cl.Fence, state, reason, micros(retryIn))
}

// finish runs q, a fenced update of cl's row, with vals (see inKey),
// reports ev (with its duration) and logs when it moved the row, and
// returns ErrLost, reported as lost, when it touched no row.
func (c *Claimer[K]) finish(ctx context.Context, op string, cl Claim[K], ev Event, logs []record, q *query, vals ...any) error {
	start := time.Now()
	args := q.bind(vals...)
	var tag pgconn.CommandTag
	err := c.stmt(ctx, func(db DBTX) (err error) {
		tag, err = db.Exec(ctx, q.text, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("claim: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		c.c.report(ctx, Event{Kind: EventLost, Rows: 1, Duration: time.Since(start)}, c.lost(op, cl))
		return ErrLost
	}
	ev.Rows, ev.Duration = 1, time.Since(start)
	c.c.report(ctx, ev, logs...)
	return nil
}

// FinishBatch finishes many claims in one statement, like Finish for each:
// done holds the claims whose rows moved to state, lost the ones no longer
// held (each also logged). err reports only failures of the statement
// itself. Inside a transaction, call it before writing the effects, and
// write effects only for done. A claim passed twice is done once at most.
// The statement finds the rows by key, so it reads as many rows as there
// are claims, whatever the table's statistics say. Claims sharing a token
// (never stamped by Claim or ClaimBatch) take a statement each.
func (c *Claimer[K]) FinishBatch(ctx context.Context, cls []Claim[K], state string) (done, lost []Claim[K], err error) {
	if err := c.checkState("FinishBatch", state); err != nil {
		return nil, nil, err
	}
	if len(cls) == 0 {
		return nil, nil, nil
	}
	start := time.Now()
	ok, err := c.matchClaims(ctx, &c.c.sqlFinishBatch, cls, state)
	if err != nil {
		return nil, nil, fmt.Errorf("claim: FinishBatch: %w", err)
	}
	took := time.Since(start)
	done = make([]Claim[K], 0, len(cls))
	var logs []record
	for i, cl := range cls {
		if ok[i] {
			done = append(done, cl)
		} else {
			lost = append(lost, cl)
			logs = append(logs, c.lost("FinishBatch", cl))
		}
	}
	c.c.report(ctx, Event{Kind: EventFinished, State: state, Rows: len(done), Duration: took})
	c.c.report(ctx, Event{Kind: EventLost, Rows: len(lost), Duration: took}, logs...)
	return done, lost, nil
}

// matchClaims runs q, a statement over the claims cls bound as inKey
// (keys) and inFence (tokens), then vals, that returns the position of the claim each
// row it touched matched (see claimsCond), and reports per claim whether it
// matched. The claims go in sorted by token. A claim whose token is already
// in the statement (the same claim passed twice, or a token stamped on
// several rows by the caller's own SQL) goes to a further statement, so that
// no statement holds a token twice; the same claim passed twice therefore
// matches at most once in a statement that moves the row.
func (c *Claimer[K]) matchClaims(ctx context.Context, q *query, cls []Claim[K], vals ...any) ([]bool, error) {
	order := make([]int, len(cls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cls[a].Fence, cls[b].Fence) })
	// rounds[r] holds the r-th claim of every token, in token order.
	rounds := [][]int{make([]int, 0, len(cls))}
	for i := 0; i < len(order); {
		j := i + 1
		for j < len(order) && cls[order[j]].Fence == cls[order[i]].Fence {
			j++
		}
		for r := range j - i {
			if r == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[r] = append(rounds[r], order[i+r])
		}
		i = j
	}
	ok := make([]bool, len(cls))
	for _, round := range rounds {
		keys := make([]K, len(round))
		fences := make([]int64, len(round))
		for i, at := range round {
			keys[i], fences[i] = cls[at].Key, cls[at].Fence
		}
		args := q.bind(append([]any{keys, fences}, vals...)...)
		var matched []int
		err := c.stmt(ctx, func(db DBTX) error {
			matched = matched[:0]
			rows, err := db.Query(ctx, q.text, args...)
			if err != nil {
				return err
			}
			for rows.Next() {
				var p int64
				if err := rows.Scan(&p); err != nil {
					rows.Close()
					return err
				}
				if p >= 1 && int(p) <= len(round) {
					matched = append(matched, round[p-1])
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		for _, i := range matched {
			ok[i] = true
		}
	}
	return ok, nil
}
