// Package rolling checks pgclaim's rolling-upgrade rule
// (docs/upgrades.md): instances of the previous release keep working while
// the current release's migrations apply and its instances start beside
// them. It is part of pgclaim's harness (harness/README.md), not of its
// API: its names may change in any release.
package rolling
