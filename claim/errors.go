package claim

import "errors"

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

// fieldError is bad input about one named field; it matches ErrInvalid.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string        { return "claim: " + e.field + ": " + e.msg }
func (e *fieldError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, msg string) error { return &fieldError{field: field, msg: msg} }
