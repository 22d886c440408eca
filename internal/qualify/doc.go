// Package qualify puts pgclaim's objects in a schema of their own: it
// validates a schema name and rewrites the static text of pgclaim's
// statements so that every pgclaim_… identifier (its tables, sequence,
// functions and domains) is qualified with the quoted schema. Nothing then
// depends on search_path, which behind PgBouncer in transaction mode is no
// per-client setting. It is part of the foundation that packages claim,
// gate and schedule stand on, and imports none of them.
package qualify
