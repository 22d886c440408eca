// Package migrations embeds pgclaim's goose SQL migrations.
//
// Files are named NNNNN_description.sql and are never edited once released;
// a change to the schema is a new file. Apply them with pgclaim.Migrate.
//
// Every migration keeps the previous release's statements working (expand
// now, contract a release later; docs/upgrades.md): during a rolling deploy
// its instances run while these apply. harness/rolling tests it.
//
// An application whose sqlc queries read pgclaim's tables needs them in its
// sqlc schema: 'pgclaim schema --out DIR' (command
// github.com/pgclaim/pgclaim/cmd/pgclaim, e.g. through a go.mod tool
// directive) writes these files into a directory of their own, or read FS
// directly.
package migrations
