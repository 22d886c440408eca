// Package grants lists the privileges an application role needs on the
// objects pgclaim's migrations create, and writes the statements that grant
// them. The list is maintained by hand; a test checks it against the catalog
// of a migrated database, so a migration that adds an object fails the
// test until the object is listed here. It is part of the foundation that
// packages claim, gate and schedule stand on, and imports none of them.
package grants
