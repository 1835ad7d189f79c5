package lockhooks

import (
	"database/sql"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// twoReplicas opens one fresh database twice through lockhooks+pgx, as two
// replicas of a service would.
func twoReplicas(t *testing.T) [2]*sql.DB {
	t.Helper()
	dsn := pgtest.DSN(t)
	name, err := Register("pgx")
	if err != nil {
		t.Fatal(err)
	}
	var dbs [2]*sql.DB
	for i := range dbs {
		if dbs[i], err = sql.Open(name, dsn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dbs[i].Close() })
	}
	return dbs
}

// noAdvisoryLocksLeft fails t if any advisory lock is held.
func noAdvisoryLocksLeft(t *testing.T, db *sql.DB) {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d advisory locks left", n)
	}
}
