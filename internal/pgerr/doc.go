// Package pgerr classifies the server's errors that retrying cannot cure and
// explains them: a missing privilege (SQLSTATE 42501) becomes an error naming
// the privilege and the statement that grants it. Every package of pgclaim
// that decides whether to retry a statement asks here. It is part of the
// foundation that packages claim, gate and schedule stand on, and imports
// none of them.
package pgerr
