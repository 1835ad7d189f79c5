// Package dberr says what a database driver's error means, without
// importing a driver: the SQLSTATE of a Postgres error (any driver whose
// errors have a SQLState() string method: pgx, lib/pq), the result code of
// a SQLite error (a Code() int method: modernc.org/sqlite), a field of the
// driver's error struct read by name (Detail, Where, Severity), and
// whether an error means the connection is gone rather than that the
// server refused the statement.
//
// It owns no state. It imports nothing of lockhooks'; from the standard
// library, database/sql/driver only for [driver.ErrBadConn], which a
// driver returns for a connection it cannot use.
package dberr
