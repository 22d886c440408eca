package schedule

import "errors"

// ErrInvalid is wrapped by every error about bad input to this package (an
// empty name, a spec that does not parse, an unknown time zone, a negative
// duration). The message names the field.
var ErrInvalid = errors.New("schedule: invalid input")

// fieldError reports bad input for one named field. It reads
// "schedule: <field>: <msg>" and unwraps to ErrInvalid.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return "schedule: " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return ErrInvalid }

// invalid returns an error naming field that wraps ErrInvalid.
func invalid(field, msg string) error { return &fieldError{field: field, msg: msg} }
