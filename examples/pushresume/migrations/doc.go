// Package migrations embeds the push service's own goose migrations.
package migrations
