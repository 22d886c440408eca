package claim

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrNotClaimed is returned by Claim when the row was not in the From
	// state: another holder claimed it first, it was already finished, or
	// there is no row with that key.
	ErrNotClaimed = errors.New("claim: not claimed: row is not in the From state")

	// ErrLost is returned by Finish, Extend and Release when the row is no
	// longer held by the claim: it was swept, released, finished, or
	// claimed again with a newer fencing token. Nothing was changed.
	ErrLost = errors.New("claim: claim lost: row is no longer held with this token")

	// ErrInvalid is matched (with errors.Is) by every error about bad
	// input: a configuration field, an argument, or a table that does not
	// match its Table spec. The error's text names the field.
	ErrInvalid = errors.New("claim: invalid input")
)

// fieldError reports bad input for one named field. It reads
// "claim: <field>: <msg>" and unwraps to ErrInvalid.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return "claim: " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return ErrInvalid }

// invalid returns an error naming field that wraps ErrInvalid.
func invalid(field, msg string) error { return &fieldError{field: field, msg: msg} }

// permanent reports whether err is a server error that running the same
// statement again cannot cure: the table, its columns, its types or its
// constraints refuse the statement itself, and only a change of the
// configuration or of the schema helps. These codes are:
//
//   - class 42, syntax error or access rule violation: an undefined column
//     (42703), table (42P01) or function (42883), a datatype mismatch
//     (42804), a syntax error in Config.Where or Order (42601), a missing
//     privilege (42501), and the like;
//   - 3F000 invalid schema name (a Table.Schema that does not exist);
//   - 22P02 invalid text representation: a state that is not a label of the
//     state column's enum ("invalid input value for enum"), or an argument
//     of the wrong type;
//   - 22001 string data right truncation: a state longer than the column's
//     varchar(n);
//   - 23502 not null violation: a column pgclaim sets to NULL is NOT NULL;
//   - 23514 check violation: a CHECK constraint rejects the state;
//   - 0A000 feature not supported.
//
// Errors that may go away are not permanent: serialization failures and
// deadlocks (class 40), lost connections (08), cancellations (57014),
// unique or foreign-key violations that depend on other rows (23505,
// 23503), a read-only session (25006).
func permanent(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	if strings.HasPrefix(pe.Code, "42") {
		return true
	}
	switch pe.Code {
	case "3F000", "22P02", "22001", "23502", "23514", "0A000":
		return true
	}
	return false
}
