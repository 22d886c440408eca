package gate

// Isolation. pgclaim's statements rely on READ COMMITTED semantics: an
// UPDATE ... WHERE or INSERT ... ON CONFLICT that meets a row changed by a
// concurrent transaction re-checks it against the newest version, where
// REPEATABLE READ and SERIALIZABLE fail with SQLSTATE 40001 instead. Every
// statement the gate runs is therefore run at READ COMMITTED, whatever
// default_transaction_isolation the database, role or pool sets:
//
//   - on the gate's dedicated lock connections (never returned to the pool)
//     the session default is set to read committed once, when the
//     connection is prepared (SessionSetup), at no cost per statement;
//   - through the pool (lockcore.ReadCommitted), each statement runs as its
//     own transaction. On a
//     connection whose session default is READ COMMITTED (asked once per
//     connection, the first time the gate uses it) the statement is sent
//     as it is: one plain round trip. On any other, it is sent in an
//     explicit READ COMMITTED transaction, BEGIN, statement and COMMIT as
//     one batch: one round trip too, and still one transaction per
//     statement, so the Lease keeps working behind a transaction-pooling
//     PgBouncer. A plain statement that fails with a serialization failure
//     (the session's default was changed since it was asked; a statement
//     failing so changed nothing) is sent again that way, and so is every
//     later one on that connection.
