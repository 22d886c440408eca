package gate

import (
	"errors"
	"testing"
)

// A field error reads "gate: <field>: <msg>" and unwraps to ErrInvalid, as
// claim's does.
func TestFieldErrorUnwrapsToErrInvalid(t *testing.T) {
	err := invalid("name", "must not be empty")
	if got := err.Error(); got != "gate: name: must not be empty" {
		t.Errorf("text %q", got)
	}
	if errors.Unwrap(err) != ErrInvalid || !errors.Is(err, ErrInvalid) {
		t.Errorf("%v does not unwrap to ErrInvalid", err)
	}
}
