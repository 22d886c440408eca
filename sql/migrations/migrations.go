// Package migrations embeds pgclaim's goose SQL migrations.
//
// Files are named NNNNN_description.sql and are never edited once released;
// a change to the schema is a new file. Apply them with pgclaim.Migrate.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
