// Package stmtlocks is the locks statements ask for, as lockhooks sees
// them from a statement's text and bound arguments, and the locks one
// transaction took: what a [DeadlockError] names as held and waited for,
// and what the lock-order checker orders.
//
// Its one job: the key of a scanned advisory call, resolved from literals
// and bound arguments ([KeyOf], [ArgInt]) or, where an argument is an
// expression, the query that has the server evaluate it and the key its
// row gives ([EvalQuery], [EvaluatedKey]); one lock as tracked ([Lock]: rows
// of a table, an advisory key, a lockset namespace), named lazily for
// messages so that tracking allocates nothing on the path every locking
// statement takes; a transaction's locks, split at the statement running
// now ([Tx]); a connection's session advisory locks for the checker
// ([Session]); and what one statement adds to them ([Note]), fed to the
// order graph of the lock-order checker ([Checker]) when it is on. And
// what a statement's lock wait is, as spans and the page name it: the
// mode, scope and keys of its advisory calls' wait ([AdvisoryWait]), the
// keys its calls wait for ([Waiting]), the mode of a row-locking wait
// ([RowLockMode]); whether it is one session lock whose key may take its
// turn in the in-process queue ([OneSessionLock]); and whether its
// arguments may be sent as text ([IntegerArgs]).
//
// State: one transaction's and one connection's tracked locks (owned by
// the caller's connection, used by one goroutine at a time); the graph is
// the lock-order checker's (internal/lockorder, safe for concurrent use).
//
// Imports: internal/sqlscan (the statement's calls and lock clauses),
// internal/advisorykey (the keys), internal/lockset (ids in lock order),
// internal/lockorder (the graph) and internal/callsite (where a lock was
// taken), internal/pgdriver (the values a driver returns, for an evaluated
// key); database/sql/driver for bound arguments.
//
// [DeadlockError]: https://pkg.go.dev/github.com/lockhooks/lockhooks#DeadlockError
package stmtlocks
