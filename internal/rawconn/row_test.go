package rawconn

import (
	"context"
	"database/sql/driver"
	"io"
	"testing"
	"time"

	_ "github.com/lib/pq" // registers "postgres"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// closeCounter counts the closes of a driver's rows.
type closeCounter struct {
	driver.Rows
	closes int
}

func (r *closeCounter) Close() error { r.closes++; return r.Rows.Close() }

// ReadRow closes a driver's rows exactly once, whatever it reads: a
// driver's Close need not be idempotent, and lib/pq's is not (a second
// Close ends the statement's context watch again and, when that context
// can be cancelled, may panic with "attempt to set nil err").
func TestReadRowClosesOnce(t *testing.T) {
	_, c := pgtest.Conn(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, q := range []string{"SELECT 1, 'a'", "SELECT 1 WHERE false", "SELECT 1 / (SELECT 0)"} {
		err := c.Raw(func(dc any) error {
			rows, err := dc.(driver.QueryerContext).QueryContext(ctx, q, nil)
			if err != nil {
				return nil // refused before any row: nothing to close
			}
			counted := &closeCounter{Rows: rows}
			_, err = ReadRow(counted)
			if counted.closes != 1 {
				t.Errorf("%s: rows closed %d times (read error %v), want once", q, counted.closes, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A Row made up by lockhooks answers its one row once; a nil one has none.
func TestOneValue(t *testing.T) {
	r := OneValue("pg_advisory_unlock", true)
	dest := make([]driver.Value, 1)
	if err := r.Next(dest); err != nil || dest[0] != true || r.Columns()[0] != "pg_advisory_unlock" {
		t.Fatalf("first Next: %v, %v, columns %v", err, dest, r.Columns())
	}
	if err := r.Next(dest); err != io.EOF {
		t.Fatalf("second Next: %v, want io.EOF", err)
	}
	var none *Row
	if none.Values() != nil {
		t.Error("a nil Row has values")
	}
}
