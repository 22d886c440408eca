// Package pgcontainer lets pgtest start PostgreSQL in a container with
// testcontainers-go when a Docker engine answers. Import it for its effect in
// one file of each test package that should use Docker:
//
//	import _ "github.com/pgclaim/pgclaim/pgtest/pgcontainer"
//
// pgtest then tries, in order, PGCLAIM_TEST_DATABASE_URL, a container, and
// local binaries. A package importing pgtest alone never links
// testcontainers-go or the Docker client, and a module importing pgtest alone
// adds none of their modules to its go.mod.
package pgcontainer
