package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// Tests for inputs a little off the main path, one per way the tracking
// once diverged from pg_locks. Each ends with pinEnv's invariant: after
// db.Close no backend of the database remains.

// trackedConn returns lockhooks' state of a *sql.Conn.
func trackedConn(t testing.TB, c *sql.Conn) *conn {
	t.Helper()
	var w *conn
	if err := c.Raw(func(dc any) error { w = dc.(connCore).state(); return nil }); err != nil {
		t.Fatal(err)
	}
	return w
}

// serverLocks returns the advisory locks pg_locks shows for backend pid
// (granted), as lockhooks names them.
func serverLocks(t testing.TB, raw *sql.DB, pid int32) map[lockKey]bool {
	t.Helper()
	got, err := readServerLocks(raw, pid)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// readServerLocks is serverLocks for goroutines other than the test's: it
// returns the read's error instead of failing the test.
func readServerLocks(raw *sql.DB, pid int32) (map[lockKey]bool, error) {
	rows, err := raw.Query(`SELECT classid::bigint, objid::bigint, objsubid::int, mode FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND pid = $1`, pid)
	if err != nil {
		return nil, fmt.Errorf("reading pg_locks of backend %d: %w", pid, err)
	}
	defer rows.Close()
	got := map[lockKey]bool{}
	for rows.Next() {
		var classid, objid int64
		var subid int
		var mode string
		if err := rows.Scan(&classid, &objid, &subid, &mode); err != nil {
			return nil, fmt.Errorf("reading pg_locks of backend %d: %w", pid, err)
		}
		k := lockKey{Shared: mode == "ShareLock"}
		if subid == 2 {
			k.Pair, k.K1, k.K2 = true, int64(int32(uint32(classid))), int64(int32(uint32(objid)))
		} else {
			k.K1 = classid<<32 | objid
		}
		got[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pg_locks of backend %d: %w", pid, err)
	}
	return got, nil
}

// keysOf lists a view's keys (session and transaction) for comparison.
func keysOf(v heldView) map[lockKey]bool {
	m := map[lockKey]bool{}
	for k := range v.session {
		m[k] = true
	}
	for k := range v.xact {
		m[k] = true
	}
	return m
}

func describeKeys(m map[lockKey]bool) string {
	var s []string
	for k := range m {
		s = append(s, k.String())
	}
	sort.Strings(s)
	return "{" + strings.Join(s, ", ") + "}"
}

// assertTracked fails unless lockhooks' view of w equals pg_locks.
func assertTracked(t testing.TB, raw *sql.DB, w *conn) {
	t.Helper()
	v := w.view()
	want, got := serverLocks(t, raw, v.pid), keysOf(v)
	if describeKeys(want) != describeKeys(got) {
		t.Errorf("%v: lockhooks tracks %s, pg_locks shows %s", w, describeKeys(got), describeKeys(want))
	}
}

func pidAlive(t testing.TB, raw *sql.DB, pid int32) bool { return backendAlive(t, raw, pid) }

// 1. A parked connection that comes to hold nothing is closed, whoever
// finds out: here the monitor, after a server-side function released the
// lock where no text showed it.
func TestParkedConnectionThatHoldsNothingIsClosed(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	mustExec(t, e.wrapped, `CREATE FUNCTION release_job(k bigint) RETURNS boolean LANGUAGE sql AS 'SELECT pg_advisory_unlock(k)'`)
	c, err := e.wrapped.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, "SELECT pg_advisory_lock(101)")
	pid := pidOf(t, c)
	var ok bool
	if err := c.QueryRowContext(ctx, "SELECT release_job(101)").Scan(&ok); err != nil || !ok {
		t.Fatalf("release_job: %v, %v", ok, err)
	}
	c.Close() // parks: lockhooks still believes it holds 101
	waitFor(t, 10*time.Second, "the emptied parked connection to be closed", func() bool { return !pidAlive(t, e.raw, pid) })
	if got := gaugeValue(t, e.metrics, "lockhooks.advisory.parked_connections"); got != 0 {
		t.Errorf("parked_connections = %d", got)
	}

	// The same found by a reroute that Postgres answers false: the holder
	// is read again, found empty, and closed.
	c, err = e.wrapped.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, c, "SELECT pg_advisory_lock(102)")
	pid = pidOf(t, c)
	if err := c.QueryRowContext(ctx, "SELECT release_job(102)").Scan(&ok); err != nil || !ok {
		t.Fatal(ok, err)
	}
	c.Close()
	if _, err := unlock(t, e.wrapped, 102); err != nil && !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("unlock of the silently released key: %v", err)
	}
	waitFor(t, 10*time.Second, "the emptied parked connection to be closed", func() bool { return !pidAlive(t, e.raw, pid) })
}

// 1b. DISCARD ALL behind a comment releases session locks; the connection
// goes back to the pool instead of parking on keys it no longer holds.
func TestDiscardAllBehindACommentIsTracked(t *testing.T) {
	e := newPinEnv(t)
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(103)")
	mustExec(t, c, "/* reset */ DISCARD ALL")
	w := trackedConn(t, c)
	assertTracked(t, e.raw, w)
	if w.holdsLocks() {
		t.Error("still believes it holds a lock after DISCARD ALL")
	}
	pid := w.view().pid
	c.Close()
	// Not parked: it holds nothing. Not pooled either: DISCARD ALL also
	// dropped the prepared statements pgx believes the server has.
	waitFor(t, 10*time.Second, "the discarded connection to close", func() bool { return !pidAlive(t, e.raw, pid) })
	if s := e.wrapped.Stats(); s.OpenConnections != 0 {
		t.Errorf("pool after DISCARD ALL: %+v", s)
	}
	mustExec(t, e.wrapped, "SELECT 1")
}

// 2. Spellings the parser once skipped: a quoted function name and a DO
// block. The lock is tracked, the connection parks, the unlock through the
// pool is rerouted and answers true.
func TestQuotedNameAndDOBlockAreTracked(t *testing.T) {
	e := newPinEnv(t)
	for i, lockStmt := range []string{
		`SELECT "pg_advisory_lock"(201)`,
		`SELECT "pg_catalog"."pg_advisory_lock"(201)`,
		`DO $$BEGIN PERFORM pg_advisory_lock(201); END$$`,
		`DO $body$ BEGIN PERFORM pg_catalog.pg_advisory_lock(201); END $body$`,
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			mustExec(t, e.wrapped, lockStmt)
			if s := e.wrapped.Stats(); s.Idle != 0 {
				t.Fatalf("the holder went back to the pool after %s: %+v", lockStmt, s)
			}
			if ok, err := unlock(t, e.wrapped, 201); !ok || err != nil {
				t.Fatalf("unlock through the pool: %v, %v", ok, err)
			}
			if n := heldCount(t, e.raw, 201); n != 0 {
				t.Fatalf("%d holders after the unlock", n)
			}
		})
	}
}

// 3. Lock and unlock by expression in one transaction: the unlock runs on
// the connection that holds the key, and nothing survives the rollback.
func TestExpressionKeysInOneTransaction(t *testing.T) {
	e := newPinEnv(t)
	tx, err := e.wrapped.Begin()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", "jobs")
	var ok bool
	if err := tx.QueryRow("SELECT pg_advisory_unlock(hashtextextended($1, 0))", "jobs").Scan(&ok); err != nil || !ok {
		t.Fatalf("unlock in the same transaction: %v, %v", ok, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d advisory locks after the rollback (%v)", n, err)
	}
	if s := e.wrapped.Stats(); s.Idle != 1 {
		t.Errorf("the connection parked: %+v", s)
	}
}

// 4. Re-entrant counts through a statement of several calls.
func TestReentrantCountsThroughMultiCallStatements(t *testing.T) {
	e := newPinEnv(t)
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "SELECT pg_advisory_lock(1)")
	mustExec(t, c, "SELECT pg_advisory_lock(1), pg_advisory_lock(2)")
	w := trackedConn(t, c)
	if v := w.view(); v.session[lockKey{K1: 1}] != 2 || v.session[lockKey{K1: 2}] != 1 {
		t.Fatalf("counts %v, want 1:2 and 2:1", v.session)
	}
	for _, k := range []int64{1, 1, 2} {
		if ok, err := unlock(t, c, k); !ok || err != nil {
			t.Fatalf("unlock(%d): %v, %v", k, ok, err)
		}
	}
	if n := heldCount(t, e.raw, 1) + heldCount(t, e.raw, 2); n != 0 {
		t.Fatalf("%d keys still held", n)
	}
	assertTracked(t, e.raw, w)
	// The results of a multi-call statement read as a row: a try, then an
	// unlock of what it took.
	var a, b bool
	if err := c.QueryRowContext(context.Background(), "SELECT pg_try_advisory_lock(3), pg_advisory_unlock(3) AS u").Scan(&a, &b); err != nil || !a || !b {
		t.Fatalf("try then unlock in one statement: %v, %v, %v", a, b, err)
	}
	assertTracked(t, e.raw, w)
	// An unlock inside a larger statement of a key another connection holds
	// cannot be rerouted: refused, naming the holder.
	other := otherConn(t, e.wrapped)
	mustExec(t, other, "SELECT pg_advisory_lock(4)")
	if _, err := c.ExecContext(context.Background(), "SELECT pg_advisory_lock(5), pg_advisory_unlock(4)"); !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("multi-call unlock of a key held elsewhere: %v, want ErrNotLockOwner", err)
	}
	mustExec(t, other, "SELECT pg_advisory_unlock(4)")
	if err := c.QueryRowContext(context.Background(), "SELECT pg_try_advisory_lock(3), pg_try_advisory_lock(3)").Scan(&a, &b); err != nil || !a || !b {
		t.Fatalf("two tries: %v %v %v", a, b, err)
	}
	if v := w.view(); v.session[lockKey{K1: 3}] != 2 {
		t.Fatalf("two successful tries counted %d", v.session[lockKey{K1: 3}])
	}
	mustExec(t, c, "SELECT pg_advisory_unlock(3), pg_advisory_unlock(3)")
	assertTracked(t, e.raw, w)
}

// 5. A session try-lock in a transaction that also holds transaction-level
// keys (from Lock): only the session key is tracked, and after COMMIT the
// connection parks on it alone.
func TestSessionTryLockBesideTransactionLocks(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	for _, viaQuery := range []bool{false, true} {
		tx, err := e.wrapped.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := Lock(ctx, tx, "accounts", 1, 2); err != nil {
			t.Fatal(err)
		}
		if viaQuery {
			var ok bool
			if err := tx.QueryRow("SELECT pg_try_advisory_lock(501)").Scan(&ok); err != nil || !ok {
				t.Fatal(ok, err)
			}
		} else {
			mustExec(t, tx, "SELECT pg_try_advisory_lock(501)")
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		parked := e.parkedViews(t)
		if len(parked) != 1 || len(parked[0].session) != 1 || parked[0].session[lockKey{K1: 501}] != 1 {
			t.Fatalf("parked: %+v, want one connection holding 501 once", parked)
		}
		if ok, err := unlock(t, e.wrapped, 501); !ok || err != nil {
			t.Fatal(ok, err)
		}
		pid := parked[0].pid
		waitFor(t, 10*time.Second, "the emptied holder to close", func() bool { return !pidAlive(t, e.raw, pid) })
	}
}

// parkedViews returns the views of the parked connections.
func (e *pinEnv) parkedViews(t testing.TB) []heldView {
	t.Helper()
	var out []heldView
	for _, w := range e.connector(t).Conns() {
		if v := w.view(); v.parked {
			out = append(out, v)
		}
	}
	return out
}

// connector returns lockhooks' state of the wrapped database.
func (e *pinEnv) connector(t testing.TB) *connector {
	t.Helper()
	sc, err := e.wrapped.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	return trackedConn(t, sc).connector
}
