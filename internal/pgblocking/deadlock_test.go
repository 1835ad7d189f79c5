package pgblocking

import (
	"fmt"
	"testing"

	"github.com/lockhooks/lockhooks/internal/pgserver"
)

// The facts of a deadlock's cycle, read on the side connection: what
// pg_stat_activity shows of each backend the DETAIL names (here a live
// one, idle in its transaction after an UPDATE), and the name of a
// relation it names by oid; nothing is read for a DETAIL without edges.
func TestDeadlockFacts(t *testing.T) {
	ctx, raw, r := serverEnv(t, "CREATE TABLE accounts (id int PRIMARY KEY); INSERT INTO accounts VALUES (1)", nil)
	c, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var pid int32
	var oid, db int64
	if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid(), 'accounts'::regclass::oid::bigint, (SELECT oid FROM pg_database WHERE datname = current_database())::bigint").Scan(&pid, &oid, &db); err != nil {
		t.Fatal(err)
	}
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET id = id WHERE id = 1"); err != nil {
		t.Fatal(err)
	}

	detail := fmt.Sprintf("Process %d waits for ShareLock on transaction 1; blocked by process 99999.\nProcess 99999 waits for ShareLock on tuple (0,1) of relation %d of database %d; blocked by process %d.", pid, oid, db, pid)
	edges := pgserver.ParseDeadlockDetail(detail)
	if len(edges) != 2 {
		t.Fatalf("edges %v", edges)
	}
	f := r.DeadlockFacts(edges, detail)
	b, ok := f.Backends[pid]
	if f.Err != nil || !ok || b.State != "idle in transaction" || b.Statement != "UPDATE accounts SET id = id WHERE id = 1" || b.XactAge < 0 {
		t.Errorf("backend %d: %+v (%v), err %v", pid, b, ok, f.Err)
	}
	if _, ok := f.Backends[99999]; ok {
		t.Error("a backend that does not exist has facts")
	}
	if name := f.Relations[fmt.Sprint(oid)]; name != "accounts" {
		t.Errorf("relation %d: %q (%v)", oid, name, f.Relations)
	}
	if f := r.DeadlockFacts(nil, "no cycle"); f.Err != nil || len(f.Backends) != 0 {
		t.Errorf("no edges: %+v", f)
	}
}
