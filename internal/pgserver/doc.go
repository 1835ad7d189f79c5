// Package pgserver is what the Postgres server says about locks, as
// lockhooks reads it on a side connection of its own: who blocks whom
// (pg_blocking_pids, followed to the root of each chain, with what
// pg_stat_activity shows of every backend met on the way: [BlockersQuery],
// [ReadBackends], [Chain]) and who holds given advisory keys (pg_locks:
// [KeyHoldersQuery], [ReadKeyHolders]) or which ones a backend holds
// itself, in one row of one column ([AppendOwnLocksQuery],
// [ParseOwnLocks], fuzzed), and whether the backends of holders are alive
// and which advisory locks they were granted, for the monitor
// ([BackendLocksQuery], [ReadBackendLocks]); and, after a deadlock, its cycle
// as the error's DETAIL tells it and what pg_stat_activity still shows of
// its backends ([ParseDeadlockDetail], [DeadlockFactsQuery],
// [ReadDeadlockFacts]), in a reader's words: the lock each side waited for
// or held, and advice that fits the pattern ([DescribeTarget],
// [DescribeRowWait], [DeadlockAdvice]). Each read is one statement; its rows become values
// (of the model of holders where they name a backend: [holders.Blocker]).
//
// It owns no state and runs nothing itself: the caller chooses the
// connection, runs the statement and hands over the rows, and matches the
// backends to its own connections. It may import database/sql/driver (the
// rows), internal/pgdriver (the values drivers return), internal/holders
// and internal/advisorykey, never the SQL scanner or the root.
package pgserver
