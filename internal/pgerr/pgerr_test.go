package pgerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestExplain(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"permission denied for table pgclaim_ticks", "the role lacks SELECT, INSERT, UPDATE, DELETE on table pgclaim_ticks; grant it with: GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgclaim_ticks TO <role>"},
		{"permission denied for table pgclaim_fence_mode", "GRANT SELECT ON TABLE pgclaim_fence_mode TO <role>"},
		{"permission denied for table pushes", "the role lacks SELECT, UPDATE on table pushes"},
		{"permission denied for sequence pgclaim_fence_seq", "GRANT USAGE, SELECT ON SEQUENCE pgclaim_fence_seq TO <role>"},
		{"permission denied for function pgclaim_raise", "GRANT EXECUTE ON FUNCTION pgclaim_raise(text, text) TO <role>"},
		{"permission denied for function pg_walfile_name", "run 'pgclaim migrate up' (or pgclaim.Migrate) so that pgclaim_fence() switches to the sequence fence"},
		{"permission denied for schema app", "GRANT USAGE ON SCHEMA app TO <role>"},
		{"must be owner of table pushes", "grant the privilege the statement needs to the role; 'pgclaim grants --role ROLE'"},
	} {
		base := &pgconn.PgError{Severity: "ERROR", Code: InsufficientPrivilege, Message: tc.msg}
		err := Explain(fmt.Errorf("gate: %q: claim tick: %w", "job", base))
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), `gate: "job": claim tick: ERROR: `+tc.msg) {
			t.Errorf("Explain(%q) = %q, want it to contain %q", tc.msg, err, tc.want)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe != base || !Permanent(err) {
			t.Errorf("Explain(%q) does not wrap the server's error", tc.msg)
		}
		if again := Explain(err); again != err {
			t.Errorf("Explain is not idempotent: %q", again)
		}
	}
	other := &pgconn.PgError{Code: "40001", Message: "could not serialize"}
	if Explain(other) != error(other) || Permanent(other) || Permanent(errors.New("x")) || Explain(nil) != nil {
		t.Error("Explain changed an error that is not a missing privilege")
	}
}

// failing is a Querier whose every query fails.
type failing struct{}

func (failing) QueryRow(context.Context, string, ...any) pgx.Row { return failedRow{} }

type failedRow struct{}

func (failedRow) Scan(...any) error { return errors.New("conn closed") }

// TestExplainAtFallback: when the catalog query fails, ExplainAt explains
// from the message as Explain does; other errors pass unchanged.
func TestExplainAtFallback(t *testing.T) {
	base := &pgconn.PgError{Severity: "ERROR", Code: InsufficientPrivilege, Message: "permission denied for table pgclaim_ticks"}
	err := ExplainAt(context.Background(), failing{}, "", fmt.Errorf("gate: %w", base))
	if !strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE pgclaim_ticks TO <role>") {
		t.Errorf("ExplainAt with a failing query = %q, want the message's explanation", err)
	}
	var p *PrivilegeError
	if !errors.As(err, &p) || p.Err != base {
		t.Errorf("ExplainAt = %q, does not wrap a *PrivilegeError", err)
	}
	other := &pgconn.PgError{Code: "40001"}
	if ExplainAt(context.Background(), failing{}, "", other) != error(other) || ExplainAt(context.Background(), failing{}, "", nil) != nil {
		t.Error("ExplainAt changed an error it does not explain")
	}
}
