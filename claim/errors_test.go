package claim

import (
	"errors"
	"testing"
)

// A field error reads "claim: <field>: <msg>" and unwraps to ErrInvalid, as
// gate's does.
func TestFieldErrorUnwrapsToErrInvalid(t *testing.T) {
	err := invalid("Config.To", "must not be empty")
	if got := err.Error(); got != "claim: Config.To: must not be empty" {
		t.Errorf("text %q", got)
	}
	if errors.Unwrap(err) != ErrInvalid || !errors.Is(err, ErrInvalid) {
		t.Errorf("%v does not unwrap to ErrInvalid", err)
	}
}
