// Package rolling checks pgclaim's rolling-upgrade rule
// (docs/upgrades.md): instances of the previous release keep working while
// the current release's migrations apply and its instances start beside
// them.
package rolling
