package lockhooks

import (
	"context"
	"database/sql"
	"testing"
)

// A write transaction on SQLite costs lockhooks at most one allocation
// over the raw driver (issue 15; the time half of the goal is measured by
// BenchmarkTx in the integration module, see BENCHMARKS.md). Allocation
// counts are exact, so this holds in CI where timings would not.
func TestSQLiteWriteTransactionAllocations(t *testing.T) {
	txAllocs := func(db *sql.DB) float64 {
		t.Helper()
		db.SetMaxOpenConns(1) // one in-memory database
		mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
		mustExec(t, db, "INSERT INTO t (v) VALUES (0)")
		ctx := context.Background()
		return testing.AllocsPerRun(500, func() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = ?", 1); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
	raw, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	wrapped, err := Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer wrapped.Close()

	r, w := txAllocs(raw), txAllocs(wrapped)
	t.Logf("allocations per write transaction: raw %v, lockhooks %v", r, w)
	if w > r+1 {
		t.Errorf("lockhooks allocates %v per write transaction, the raw driver %v: more than one extra", w, r)
	}
}
