package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// ErrMissingIndex is matched by the warning Worker.Verify and
// Sweeper.Verify return when a partial index they rely on is missing: the
// index on the claim state (Config.From) that batch claims select rows
// through, or the one on the processing state (Config.To) that sweeps
// select through. Without it every batch rescans the rows already finished,
// and a long run slows down as it goes; nothing else goes wrong. Such a
// warning is returned only when the table has no other problem, so an
// error matching ErrMissingIndex never hides one matching ErrInvalid: a
// caller may log it and go on:
//
//	if err := w.Verify(ctx); err != nil && !errors.Is(err, claim.ErrMissingIndex) {
//		return err
//	}
//
// NewWorker and NewSweeper log it at warn level and do not fail.
var ErrMissingIndex = errors.New("claim: missing partial index")

// indexWarning is a missing partial index; it matches ErrMissingIndex.
type indexWarning struct {
	field string
	msg   string
}

func (e *indexWarning) Error() string        { return "claim: " + e.field + ": " + e.msg }
func (e *indexWarning) Is(target error) bool { return target == ErrMissingIndex }

// stateRef is a configured state and the field it comes from.
type stateRef struct {
	field, value string
}

// verifySpec is what a Verify checks beyond the table's columns.
type verifySpec struct {
	// states are checked against the state column's enum labels and
	// CHECK constraints.
	states []stateRef
	// indexed are states that need a partial index (ClaimBatch: From;
	// Sweeper: To); a missing one is a warning.
	indexed []indexNeed
}

// indexNeed is a state that a statement selects rows by.
type indexNeed struct {
	stateRef
	by   string // what selects by it, e.g. "batch claims"
	cols string // the quoted columns of the suggested index
	note string // appended to the suggestion
}

// verifyTimeout bounds the default verification of NewWorker and
// NewSweeper, which take no context.
const verifyTimeout = 10 * time.Second

// verify runs the checks of Claimer.Verify with the From and To states and
// those in extra.
func (c *Claimer[K]) verify(ctx context.Context, extra verifySpec) error {
	extra.states = append([]stateRef{{"Config.From", c.c.from}, {"Config.To", c.c.to}}, extra.states...)
	return c.c.t.verify(ctx, c.db, extra)
}

// Verify checks everything Claimer.Verify checks, and also that the
// worker's Done, Failed and Retry.State states are allowed by the state column
// (its enum labels and its CHECK constraints of the forms
// "col IN (...)", "col = ANY (ARRAY[...])", "col = '...'" and OR or AND
// combinations of them; a constraint of another form is not checked), and
// that the role has the privileges a claim needs: SELECT and UPDATE on the
// table's configured columns (or the whole table), and, with Table.Fence,
// USAGE on pgclaim_fence_seq and EXECUTE on pgclaim_fence(). Any problem is
// an error matching ErrInvalid naming the field (a missing privilege: with
// the GRANT that fixes it). When all that holds, it returns a warning
// matching ErrMissingIndex if no valid partial index restricted to
// Config.From exists (batch claims need it), and nil otherwise. NewWorker
// calls it unless WorkerConfig.SkipVerify is set.
func (w *Worker[K]) Verify(ctx context.Context) error {
	t := w.c.c.t
	return withPrivileges(ctx, w.c.db, t, true, w.c.verify(ctx, verifySpec{
		states: []stateRef{
			{"WorkerConfig.Done", w.cfg.Done},
			{"WorkerConfig.Failed", w.cfg.Failed},
			{"WorkerConfig.Retry.State", w.cfg.Retry.State},
		},
		indexed: []indexNeed{{stateRef: stateRef{"Config.From", w.c.c.from}, by: "batch claims", cols: t.key,
			note: " (index the Config.Order columns)"}},
	}))
}

// Verify checks the table against its spec like Claimer.Verify, and that
// Config.To and the sweeper's Failed and Retry.State states are allowed by the
// state column (enum labels and simple CHECK constraints, as for
// Worker.Verify; the claimer's From is not checked, a sweeper does not use
// it). Any problem is an error matching ErrInvalid naming the field. When
// all that holds, it returns a warning matching ErrMissingIndex if no valid
// partial index restricted to Config.To exists (sweeps select through it),
// and nil otherwise. It checks the privileges on the table as
// Worker.Verify does (a sweep takes no fencing token). NewSweeper calls it
// unless SweeperConfig.SkipVerify is set.
func (s *Sweeper[K]) Verify(ctx context.Context) error {
	t := s.c.c.t
	hint := t.claimedAt
	if t.leaseUntil != "" && s.cfg.StaleAfter == 0 {
		hint = t.leaseUntil
	}
	return withPrivileges(ctx, s.c.db, t, false, s.c.c.t.verify(ctx, s.c.db, verifySpec{
		states: []stateRef{
			{"Config.To", s.c.c.to},
			{"SweeperConfig.Failed", s.cfg.Failed},
			{"SweeperConfig.Retry.State", s.cfg.Retry.State},
		},
		indexed: []indexNeed{{stateRef: stateRef{"Config.To", s.c.c.to}, by: "sweeps", cols: hint}},
	}))
}

// withPrivileges returns err, the table's verification, unless it found
// nothing wrong (nil, or only missing indexes): then what the role lacks of
// the privileges on the table and, with fence, on the fence, if anything,
// else err.
func withPrivileges(ctx context.Context, db DBTX, t *table, fence bool, err error) error {
	if err != nil && !errors.Is(err, ErrMissingIndex) || errors.Is(err, ErrInvalid) {
		return err
	}
	if perr := t.verifyPrivileges(ctx, db, fence); perr != nil {
		return perr
	}
	return err
}

// verifyPrivileges asks the catalog whether the current role may do what
// claims, finishes and sweeps do: SELECT the configured columns, UPDATE
// all but the key and, with fence, take a token (USAGE on the sequence,
// EXECUTE on the function). It returns one error per missing privilege,
// naming the GRANT that fixes it.
func (v *table) verifyPrivileges(ctx context.Context, db DBTX, fence bool) error {
	s := v.spec
	var cols []string
	for _, c := range []string{s.Key, s.State, s.ClaimedAt, s.ClaimedBy, s.Fence, s.LeaseUntil, s.Attempts, s.RetryAt, s.Reason} {
		if c != "" {
			cols = append(cols, c)
		}
	}
	seq, fn := v.pgclaim.Object("pgclaim_fence_seq"), v.pgclaim.Object("pgclaim_fence()")
	var role string
	var noSelect, noUpdate []string
	var seqOK, fnOK bool
	err := db.QueryRow(ctx, `
SELECT current_user::text,
       ARRAY(SELECT c FROM unnest($2::text[]) WITH ORDINALITY u(c, i) WHERE NOT has_column_privilege($1::text, c, 'SELECT') ORDER BY i),
       ARRAY(SELECT c FROM unnest($2::text[]) WITH ORDINALITY u(c, i) WHERE i > 1 AND NOT has_column_privilege($1::text, c, 'UPDATE') ORDER BY i),
       CASE WHEN $3::bool THEN has_sequence_privilege($4::text, 'USAGE') OR has_sequence_privilege($4::text, 'UPDATE') ELSE true END,
       CASE WHEN $3::bool THEN has_function_privilege($5::text, 'EXECUTE') ELSE true END`,
		v.qname, cols, fence && s.Fence != "", seq, fn).Scan(&role, &noSelect, &noUpdate, &seqOK, &fnOK)
	if err != nil {
		return fmt.Errorf("claim: Verify: privileges: %w", err)
	}
	r := quote(role)
	var errs []error
	lacks := func(priv string, missing []string, all int) {
		if len(missing) == 0 {
			return
		}
		what, grant := "table "+v.qname, priv
		if len(missing) < all {
			what = "columns " + strings.Join(missing, ", ") + " of table " + v.qname
			quoted := make([]string, len(missing))
			for i, c := range missing {
				quoted[i] = quote(c)
			}
			grant += " (" + strings.Join(quoted, ", ") + ")"
		}
		errs = append(errs, invalid("Table.Name", fmt.Sprintf("role %s lacks %s on %s, which claims need; grant it with: GRANT %s ON TABLE %s TO %s",
			r, priv, what, grant, v.qname, r)))
	}
	lacks("SELECT", noSelect, len(cols))
	lacks("UPDATE", noUpdate, len(cols)-1)
	if !seqOK {
		errs = append(errs, invalid("Table.Fence", fmt.Sprintf("role %s lacks USAGE on sequence %s, from which each claim takes its fencing token; grant it with: GRANT USAGE, SELECT ON SEQUENCE %s TO %s",
			r, seq, seq, r)))
	}
	if !fnOK {
		errs = append(errs, invalid("Table.Fence", fmt.Sprintf("role %s lacks EXECUTE on function %s, which gives each claim its fencing token; grant it with: GRANT EXECUTE ON FUNCTION %s TO %s",
			r, fn, fn, r)))
	}
	return errors.Join(errs...)
}

// verifyOnNew runs verify for a constructor and returns what it found
// wrong with the table or the states (an error matching ErrInvalid). A
// missing partial index (ErrMissingIndex) is logged at warn level, and so
// is a failure to ask the database at all (it is unreachable, or slower
// than verifyTimeout): the constructor does not fail for those, and the
// statements that later run into the same trouble report it as before.
func verifyOnNew(ctor string, c *core, verify func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), verifyTimeout)
	defer cancel()
	err := verify(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrInvalid):
		return err
	case errors.Is(err, ErrMissingIndex):
		c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: "+ctor+": missing partial index",
			slog.String("table", c.t.qname), slog.Any("warning", err)))
	default:
		c.report(ctx, Event{}, rec(slog.LevelWarn, "claim: "+ctor+": could not verify the table and states",
			slog.String("table", c.t.qname), slog.Any("error", err)))
	}
	return nil
}
