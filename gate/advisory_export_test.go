package gate

import "time"

// Tests ping quiet lock connections often, so a silent network is found in
// well under a second and the ping path runs in every test.
func init() { pingEvery = 250 * time.Millisecond }
