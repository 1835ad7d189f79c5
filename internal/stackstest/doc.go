// Package stackstest holds the integration tests that prove the Go
// database stacks people use (database/sql, sqlx, GORM, ent) work unchanged
// on lockhooks, on real PostgreSQL and SQLite. It has no code of its own;
// the stacks are test-only dependencies kept out of the library's tests.
package stackstest
