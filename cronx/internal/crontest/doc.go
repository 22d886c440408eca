// Package crontest holds what the cron adapters' tests share: a table of
// runs, an observer of gate events, a daily schedule, and the check that a
// run's allowed delay follows the gate's skew tolerance.
package crontest
