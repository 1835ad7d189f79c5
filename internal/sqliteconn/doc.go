// Package sqliteconn sets on a new SQLite connection what lockhooks relies
// on, where the DSN leaves it unset: a busy timeout, journal_mode=WAL
// (readers do not block the writer) and foreign_keys=ON ([Defaults]).
//
// WAL is the one default that writes to the database file: it is never
// applied on a read-only open, nor under _txlock=exclusive, and the
// switches of one database's connections take turns, retried with backoff
// while SQLite answers SQLITE_BUSY, within the connection's busy timeout.
// Each pragma's result row is read before its rows are closed, since some
// drivers run a statement only as its rows are stepped.
//
// State: one database's turn to switch a connection to WAL (a channel of
// one); nothing else.
//
// Imports: internal/sqlitelock (what the DSN sets itself),
// internal/rawconn (running the pragmas), internal/dberr (SQLITE_BUSY),
// internal/retry (the backoff and its wait) and internal/pgdriver (the
// values drivers return, converted); database/sql/driver for the
// connection.
package sqliteconn
