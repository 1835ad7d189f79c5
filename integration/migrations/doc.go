// Package migrations holds the tests that prove the migration tools' own
// Postgres locking (goose's session locker, golang-migrate's advisory lock)
// runs unchanged through lockhooks, from two replicas at once. It has no code
// of its own.
package migrations
