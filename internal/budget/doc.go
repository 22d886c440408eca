// Package budget is the connection budget of one pgclaim instance, in one
// place: what 'pgclaim doctor' plans max_connections with, and what the
// packages that hold sessions outside the pool promise to stay within. It
// is part of the foundation that packages claim, gate and schedule stand
// on, and imports none of them.
package budget
