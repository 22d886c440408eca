package gate

// productionPingEvery is pingEvery as built, before the tests' init
// shortens it.
var productionPingEvery = pingEvery

// UseProductionPing makes the connection watch ping as it does in
// production, and returns a function restoring the tests' setting. Only for
// tests that run alone (not parallel), since runs of other tests read it.
func UseProductionPing() (restore func()) {
	old := pingEvery
	pingEvery = productionPingEvery
	return func() { pingEvery = old }
}
