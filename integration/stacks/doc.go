// Package stacks holds the integration tests that prove the Go
// database stacks people use (database/sql, sqlx, GORM, ent) work unchanged
// on lockhooks, on real PostgreSQL and SQLite. It has no code of its own;
// the stacks are dependencies of the integration module only, so the
// library's go.mod sets no version floor on them for its users.
package stacks
