package lockhooks

import (
	"context"
	"testing"

	"github.com/lockhooks/lockhooks/internal/sqlitelock"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// TestInterceptClassifiesOnce: a statement's first sight is one
// classification (one pass over its text) and a repeat is none; a text
// without "for" or "advisory" is not classified at all.
func TestInterceptClassifiesOnce(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		d         Dialect
		query     string
		classify  int64 // classifications on first sight
		write     bool
		locks     bool
		advisory  bool
		table     string
		classSeen bool
	}{
		{Postgres, "SELECT * FROM jobs j WHERE id = $1 FOR UPDATE", 1, false, true, false, "j", true},
		{Postgres, "SELECT pg_advisory_lock($1)", 1, false, false, true, "", true},
		{Postgres, "SELECT * FROM jobs WHERE id = $1", 0, false, false, false, "", false},
		{SQLite, "SELECT * FROM jobs WHERE id = ? FOR UPDATE", 1, false, true, false, "jobs", true},
		{SQLite, "INSERT INTO forms (id) VALUES (?)", 1, true, false, false, "", true},
		{SQLite, "UPDATE jobs SET state = 'done' WHERE id = ?", 0, false, false, false, "", false},
	} {
		conn := &conn{connector: newConnector(nil, nil, mustOptions(t, WithDialect(c.d)), "", sqlitelock.DSN{})}
		r := conn.connector.rewriter
		st := conn.intercept(ctx, c.query)
		if got := r.classified.Load(); got != c.classify {
			t.Errorf("%s %q: first sight classified %d times, want %d", c.d, c.query, got, c.classify)
		}
		again := conn.intercept(ctx, c.query)
		if got := r.classified.Load(); got != c.classify {
			t.Errorf("%s %q: a repeat classified again (%d in all)", c.d, c.query, got)
		}
		if again != st {
			t.Errorf("%s %q: the repeat differs: %+v, first %+v", c.d, c.query, again, st)
		}
		if (st.facts&classified != 0) != c.classSeen || (st.facts&writes != 0) != c.write || st.locks.Locks() != c.locks ||
			(st.advisory != nil) != c.advisory || st.firstTable != c.table {
			t.Errorf("%s %q: statement %+v", c.d, c.query, st)
		}
		if c.d == SQLite && st.writes() != sqlscan.IsWrite(c.query) {
			t.Errorf("%s %q: writes() = %v, IsWrite the opposite", c.d, c.query, st.writes())
		}
	}
}

// TestKeepForUpdateClassifiesUncached: a KeepForUpdate statement is
// classified with Inspect each time, not cached, and keeps FOR UPDATE.
func TestKeepForUpdateClassifiesUncached(t *testing.T) {
	conn := &conn{connector: newConnector(nil, nil, mustOptions(t, WithDialect(Postgres)), "", sqlitelock.DSN{})}
	ctx := KeepForUpdate(context.Background())
	const q = "SELECT * FROM jobs WHERE id = $1 FOR UPDATE"
	for i := range 2 {
		st := conn.intercept(ctx, q)
		if st.text != q || st.rewrote || st.locks&sqlscan.ForUpdate == 0 || st.firstTable != "jobs" {
			t.Fatalf("statement %+v", st)
		}
		if got := conn.connector.rewriter.classified.Load(); got != int64(i+1) {
			t.Fatalf("%d statements classified %d times", i+1, got)
		}
	}
	if st := conn.intercept(context.Background(), q); !st.rewrote {
		t.Errorf("without KeepForUpdate: %+v", st)
	}
}
