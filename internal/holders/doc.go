// Package holders names who holds a lock someone waits for, as one value
// every consumer formats the same way.
//
// Its one job: a [Holder] is a connection of a lockhooks database, of this
// process or of another one, with what the model of holders and waiters
// knows of it (its database, connection number, backend pid, the Go call
// site where it took the lock or began its transaction, since when, its
// trace). Errors, the slow-wait log, spans and /debug/locks format a
// Holder only through it ([Holder.String], [Holder.LogArgs],
// [Holder.Who], [Holder.Where]), so a holder reads the same everywhere.
// A [Blocker] is a Postgres backend that blocks a wait as the server
// shows it, before (or instead of) being named as a Holder; a [Blockage]
// is all that blocks one wait (the holders named, the backends nobody
// identified, what the server showed), formatted once for every consumer.
// An [Event] is
// one thing that happened to a database's locks; [Events] keeps a
// database's last ones for the page. [Databases] is the set of databases
// open in a process, each numbered and named once as it joins.
// Finding the holders (connections, pg_locks rows, a backend's connection
// among the open databases) is the root package's business, and the span
// attributes of a holder internal/telemetry's.
//
// State: none but a database's [Events] (a bounded ring, written on rare
// paths only) and a process's [Databases] (the caller keeps the one
// registry; bounded by [MaxDatabases]).
//
// Imports: nothing of lockhooks' own; OpenTelemetry's trace package for a
// holder's span.
package holders
