// Package pgbegin is lockhooks' own BEGIN and COMMIT on Postgres.
//
// A transaction has two things to say in BEGIN's round trip: RunInTx's
// transaction id, which a cut-off COMMIT is resolved by (internal/retry),
// and its identity for waiters in other processes, a transaction-local
// application_name naming where it began (internal/identity). Where either
// is wanted and the driver allows it, lockhooks sends the BEGIN itself, in
// one simple-protocol message composed of what the transaction needs
// ([Message], [Clause]), and ends the transaction with its own COMMIT and
// ROLLBACK ([Commit], [Rollback]):
//
//	pgx, RunInTx:    SELECT <id> FROM (SELECT set_config('application_name', …, true)) …; BEGIN [READ ONLY]
//	lib/pq, RunInTx: BEGIN [ISOLATION LEVEL …] [READ ONLY]; SELECT <id> FROM (SELECT set_config(…)) …
//	any other:       BEGIN [ISOLATION LEVEL …] [READ ONLY]; SELECT set_config(…)
//
// pgx returns only the first statement's rows, so its id is queried before
// BEGIN: statements before BEGIN in one message form an implicit
// transaction that BEGIN turns into the transaction block, keeping its id
// and its transaction-local settings, but a query there fixes the
// isolation level, so through pgx only transactions at the default level
// learn their id at BEGIN (the others read it before COMMIT, in a round
// trip of their own). lib/pq returns the rows of the text's first
// statement that has some. A connection that publishes no identity (its
// application_name is the user's) and a transaction that is not RunInTx's
// begin as the driver begins them; so do all transactions of a driver that
// cannot run such a message (neither pgx's stdlib nor lib/pq) and of one
// that turned out not to (it prepared the text, SQLSTATE 42601:
// [AfterFailure]).
//
// The simple protocol through database/sql, without naming the driver's
// types (internal/pgdriver finds what each allows): lib/pq runs every
// query without arguments that way; pgx's stdlib runs a query that way
// when its first argument is pgx's QueryExecModeSimpleProtocol (a value
// found by reflection, once per database), and an Exec without arguments
// always. The simple protocol also keeps texts that change with every
// hold (the identities) out of pgx's statement cache.
//
// It holds no state but the caller's last message; it runs its statements
// on the caller's connection ([Conn]).
//
// It may import internal/retry (the transaction id's query and where it
// goes), internal/identity (the application_name statement),
// internal/dberr (whether an error is the server's) and internal/pgdriver
// (what the driver allows, its transaction status); never the root, the
// SQL scanner or the session-lock machine.
package pgbegin
