// Package inprocess is the in-process locks of one lockhooks database as
// the model of holders sees them: who holds and who waits in the lock
// tables (SQLite's advisory locks, the queue of turns of Postgres advisory
// keys, Lock's lockset ids: [Table]) and at the SQLite writer lock
// ([WriterHolder]), named as holders ([holders.Holder]) the one way every
// consumer formats them; who waits for whom among them ([Tables.Edges]),
// for the page, the slow-wait log, the wait spans and the errors; the
// error of a table wait that gave up or was refused ([Owners.ExplainWait]);
// and who takes a lock, for the self-wait checks of its waiters ([Taker]:
// the taker's call chain, its span and the hint of a likely self-wait),
// with the sentinel [ErrSelfWait] the root exports.
//
// The locks themselves (FIFO hand-over, the writer queue) are
// internal/sqlitelock's; this package holds no state beyond them. Owners
// are the caller's values (its connections, transactions, advisory
// locks): the caller names them ([Owners]).
//
// It may import internal/sqlitelock (the locks), internal/callsite (call
// sites and call chains), internal/holders (the holder value) and
// internal/lockset (the names of lockset ids), and OpenTelemetry's trace
// package (a taker's span); never a driver, the SQL scanner or the root.
package inprocess
