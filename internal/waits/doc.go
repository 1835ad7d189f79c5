// Package waits is the lock waits in progress of one database, as the
// debug page and the slow-wait log know them, and the slow-wait log
// itself.
//
// Its one job: a [Watch] lists each wait ([Entry]) from the moment a lock
// is asked for to the moment the wait ends, in an intrusive list (listing
// a wait allocates nothing), and one goroutine per database, started at
// the first wait it has to watch, sleeps until the oldest unreported wait
// passes the slow-wait threshold. Then it asks the caller who holds what
// the wait waits for ([Config.HoldersOf]), logs a "still waiting" line
// naming the holder and, when the wait ends, a last line with its outcome.
// Where the caller asks for it ([Config.LookUpBeforeDeadline]: lockhooks
// does on Postgres), a wait whose context has a deadline is also looked up
// shortly before it, so that the error of a wait that times out can name
// the holder the server forgets the moment the driver cancels the wait.
//
// A [Lock] is one wait from start to end, the caller's record of it (one
// allocation): begun by [Watch.Start], timed and traced by the
// [Config.Telemetry], with its self-wait hint added to its timeout's
// error, the caller's probe beside it, and, once it passes the
// telemetry's blocker threshold, the lookup of its blockers for its span
// (on a goroutine of the wait's own, [Lock.LookForBlockers]); ended by
// [Lock.End], with the span a wait outside any trace would have had.
//
// The waiting connection and the advisory key are the caller's types (the
// type parameters W and K): the package only compares a waiter with its
// zero value and asks it for its log attributes and its backend pid
// ([Waiter]), and never looks inside a key. Finding
// holders (connections, pg_locks, the registry of databases) is the
// caller's business; naming them is internal/holders'.
//
// State: one database's waits in progress, guarded by the Watch's mutex
// (an Entry's fields by the mutex of the Watch that lists it), and the
// counters of all its waits, in atomics.
//
// Imports: internal/holders (a holder found), internal/telemetry (a wait
// is timed by a telemetry.Wait, kept by value in its Entry),
// internal/callsite (where the wait was asked for); never the SQL scanner,
// a driver-level package or the session-lock machinery.
package waits
