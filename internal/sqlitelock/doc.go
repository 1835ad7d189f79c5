// Package sqlitelock holds the in-process locks of SQLite and of locksets:
// a [Table] of exclusive per-key locks, taken on demand and released only
// when told, handed over to their waiters in FIFO order; and the [Writer],
// the process-wide lock that serialises the writers of one SQLite
// database, so that they queue in memory instead of meeting SQLITE_BUSY.
// And the law of the SQLite DSN these locks depend on: what a DSN sets
// itself ([ParseDSN]: busy timeout, journal mode, foreign keys, read-only
// opens, _txlock) and who begins write transactions IMMEDIATE, lockhooks or
// modernc.org/sqlite ([DSN.PlanModerncBegin], and the one field of modernc's
// connection lockhooks sets, [BeginModerncImmediate]).
//
// The state it owns is the locks themselves: for each held key (or the
// writer lock) its owner, since when it is held, where it was taken and
// its queue of waiters. Who an owner is, and how a wait is reported (its
// error messages, its span, its events), is the caller's: the caller
// describes each taker with a value of its own (a [Taker], which also tells
// whether a wait would be a self-wait), and the locks hand that value back
// with the holder. Waits that must be timed are split in two steps (take
// or queue, then wait) so that the caller reports them between the two.
//
// It imports internal/callsite only, of this module.
package sqlitelock
