package budget

// DedicatedSessions is how many sessions one instance holds outside its
// pool's MaxConns by default: the session the gate's and the scheduler's
// advisory locks live on, and the LISTEN session the schedulers and claim
// workers of a pool share (internal/listen).
const DedicatedSessions = 2

// PerInstance is the most connections one instance holds with a pool of
// maxConns: maxConns + DedicatedSessions.
func PerInstance(maxConns int) int { return maxConns + DedicatedSessions }
