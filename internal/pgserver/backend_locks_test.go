package pgserver

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq" // registers "postgres"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The monitor's read against a real server: a backend that holds a lock
// is alive and holds it (exclusive and shared keys told apart), a pid that
// is no backend is not alive, and the read names the backend it ran on.
func TestReadBackendLocks(t *testing.T) {
	db, holder := pgtest.Conn(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pid int32
	if err := holder.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_lock(7), pg_advisory_lock_shared(1, 2)"); err != nil {
		t.Fatal(err)
	}
	reader, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var self int32
	if err := reader.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&self); err != nil {
		t.Fatal(err)
	}
	const gone = 1 // pid 1 is never a backend
	var got BackendLocks
	err = reader.Raw(func(dc any) error {
		rows, err := dc.(driver.QueryerContext).QueryContext(ctx, BackendLocksQuery([]int32{pid, gone}), nil)
		if err != nil {
			return err
		}
		defer rows.Close()
		got, err = ReadBackendLocks(rows)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	exclusive := advisorykey.Key{K1: 7}
	shared := advisorykey.Key{Pair: true, K1: 1, K2: 2, Shared: true}
	if !got.Alive[pid] || got.Alive[gone] || got.RanOn != self {
		t.Errorf("alive %v, ran on %d (the reader is %d)", got.Alive, got.RanOn, self)
	}
	if !got.Holds(pid, exclusive) || !got.Holds(pid, shared) || got.Holds(pid, shared.Exclusive()) || len(got.Held[pid]) != 2 {
		t.Errorf("backend %d holds %v, want %v and %v", pid, got.Held[pid], exclusive, shared)
	}
	if q := BackendLocksQuery(nil); !strings.Contains(q, "ON false") {
		t.Errorf("the read of no backend: %s", q)
	}
}
