package pgblocking

import (
	"database/sql"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
)

// A probe against real backends: it cancels the waiter's statement only
// where the holder it names blocks it, and only while the caller says it
// is safe; Stop says whether it did.
func TestProbeCancelsOnlyAWaitForTheHolder(t *testing.T) {
	ctx, raw, r := serverEnv(t, "CREATE TABLE jobs (id int PRIMARY KEY); INSERT INTO jobs VALUES (1)", nil)
	pidOf := func(c *sql.Conn) (pid int32) {
		if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	holderConn, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holderConn.Close()
	holder := pidOf(holderConn)
	tx, err := holderConn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "UPDATE jobs SET id = id WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	waiterConn, err := raw.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiterConn.Close()
	waiter := pidOf(waiterConn)

	// wait runs the waiter's FOR UPDATE with a probe for blocker (safe as
	// given), ended by a lock_timeout of its own.
	wait := func(blocker int32, safe bool) (cancelled bool, err error) {
		if _, err := waiterConn.ExecContext(ctx, "SET lock_timeout = '1s'"); err != nil {
			t.Fatal(err)
		}
		p := r.Probe(20*time.Millisecond, waiter, blocker, func() bool { return safe })
		err = waiterConn.QueryRowContext(ctx, "SELECT id FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(int))
		return p.Stop(), err
	}
	if hit, err := wait(holder, true); !hit || dberr.SQLState(err) != "57014" {
		t.Errorf("a wait for the holder: %v, cancelled %v; want cancelled (57014)", err, hit)
	}
	if hit, err := wait(holder, false); hit || dberr.SQLState(err) != "55P03" {
		t.Errorf("a wait while not safe: %v, cancelled %v; want its lock_timeout", err, hit)
	}
	if hit, err := wait(waiter+holder, true); hit || dberr.SQLState(err) != "55P03" {
		t.Errorf("a wait for another backend: %v, cancelled %v; want its lock_timeout", err, hit)
	}
	p := r.Probe(time.Hour, waiter, holder, func() bool { return true })
	if p.Stop() {
		t.Error("a probe stopped before its delay cancelled something")
	}
}
