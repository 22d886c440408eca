package lockcore

// GrowStack grows the calling goroutine's stack, in one step and while it
// is still shallow, to the size a run's statements reach deep inside pgx
// (32 KiB). A new goroutine starts with 8 KiB; a gate call made on one grew
// it twice, at 16 and 32 KiB, the second time deep in pgx's read path, and
// each growth copies every frame then on the stack. Cron libraries start a
// goroutine for every run, so every Once, Exclusive or lease acquisition
// they make paid it: with 8 instances firing each tick together
// (gate's BenchmarkOnceFiredTogether), stack copies were 15% of the
// client's CPU, and 4% with this call. On a goroutine whose stack is grown
// already it costs clearing the frame below.
//
//go:noinline
func GrowStack() {
	var frame [stackFrame]byte
	if frame[stackIndex] != 0 { // never: the read keeps the frame
		panic("lockcore: GrowStack: a fresh frame was not zeroed")
	}
}

// stackFrame is the frame GrowStack takes: more than 16 KiB, so that with
// the caller's frames a stack of 16 KiB is too small and the runtime goes
// to 32 KiB at once.
const stackFrame = 20 << 10

// stackIndex is read by GrowStack, which keeps its frame from being
// optimized away.
var stackIndex = stackFrame - 1
