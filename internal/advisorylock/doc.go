// Package advisorylock is what one AdvisoryLock does on the Postgres
// server, whatever adapter hands it out: the lock statement (with the
// fencing token in the same round trip where the connection reaches the
// server itself, or alone; a try), the token read apart, the unlock at
// Release and what makes sure a failed unlock or a failed acquisition
// leaves no lock behind on a pooled connection (a rollback of a
// transaction begun by statement text and a second unlock, else the
// connection closed), and the loss of a lock released by a statement on
// its own connection. The in-process part (the key's turn among this
// process's acquirers, the registry of locks handed out, SQLite's
// in-process stand-in) stays with the adapter, which gives its side of
// the lock as a [Hold]: how its statements run on the lock's connection.
//
// State: a [Lock]'s key, token and how it was taken; a [Database]'s
// memory that the server refuses the token in the lock statement; a
// [Clock]'s last in-process token. The lock's tracking is the session-lock
// machine's (internal/pgsession), which the Lock reads and marks lost.
//
// Imports: internal/pgsession (the connection's session-lock tracking),
// internal/pgstmt (the fencing token's annotation), internal/keynames
// (keys named for a reader), internal/pgdriver and internal/dberr (what
// the driver's values and errors say).
package advisorylock
