package pgtest

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// Conn opens a new, empty database for t (see DSN) through driverName,
// which the caller's imports registered, and returns it with one of its
// connections; both are closed when t ends.
func Conn(t testing.TB, driverName string) (*sql.DB, *sql.Conn) {
	t.Helper()
	db, err := sql.Open(driverName, DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return db, c
}
