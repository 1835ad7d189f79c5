package lockhooks

// Tracking across reroutes, cancels and closes: a cancelled transaction keeps
// its session locks, a rerouted unlock keeps its alias, the caller's deadline
// does not cut a reroute short, Close during reroutes, and inputs reviews found.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/lockset"
)

// 6. A transaction whose context is cancelled rolls back; the connection
// and its session lock stay.
func TestCancelledTransactionKeepsSessionLocks(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 601)
	if err != nil {
		t.Fatal(err)
	}
	txCtx, cancel := context.WithCancel(ctx)
	tx, err := l.Conn().BeginTx(txCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "SELECT 1")
	cancel()
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("rollback after cancel: %v", err)
	}
	// database/sql rolls back from its own goroutine: wait until the
	// connection is free again.
	waitFor(t, 10*time.Second, "the connection after the rollback", func() bool { return l.Conn().PingContext(ctx) == nil })
	select {
	case <-l.Lost():
		t.Fatalf("the lock was lost: %v", l.Err())
	default:
	}
	if n := heldCount(t, e.raw, 601); n != 1 {
		t.Fatalf("%d holders of 601 after the cancelled transaction", n)
	}
	var inTx bool
	if err := l.Conn().QueryRowContext(ctx, "SELECT transaction_timestamp() <> statement_timestamp()").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// 7. A rerouted unlock answers in a column named as the statement named it.
func TestReroutedUnlockKeepsTheAlias(t *testing.T) {
	e := newPinEnv(t)
	for _, c := range []struct{ stmt, col string }{
		{"SELECT pg_advisory_unlock(701) AS released", "released"},
		{`SELECT pg_advisory_unlock(701) "Released"`, "Released"},
		{"SELECT pg_advisory_unlock(701)", "pg_advisory_unlock"},
	} {
		mustExec(t, e.wrapped, "SELECT pg_advisory_lock(701)")
		rows, err := e.wrapped.Query(c.stmt)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		rows.Close()
		if len(cols) != 1 || cols[0] != c.col {
			t.Errorf("%s: columns %v, want [%s]", c.stmt, cols, c.col)
		}
		if n := heldCount(t, e.raw, 701); n != 0 {
			t.Fatalf("%d holders after %s", n, c.stmt)
		}
	}
}

// 8. Transaction-level locks that protect something are followed, not
// refused: a migration file's own BEGIN … COMMIT, a multi-statement text
// (one implicit transaction), and a textual BEGIN on a *sql.Conn. A lone
// autocommit statement is still refused.
func TestTransactionLevelLocksInTextTransactions(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	mustExec(t, e.wrapped, "BEGIN; SELECT pg_advisory_xact_lock(11); CREATE TABLE m1 (id int); COMMIT;")
	mustExec(t, e.wrapped, "SELECT pg_advisory_xact_lock(12); CREATE TABLE m2 (id int);")
	c := otherConn(t, e.wrapped)
	mustExec(t, c, "BEGIN")
	mustExec(t, c, "SELECT pg_advisory_xact_lock(13)")
	if n := heldCount(t, e.raw, 13); n != 1 {
		t.Fatalf("xact lock after a textual BEGIN: %d holders", n)
	}
	w := trackedConn(t, c)
	assertTracked(t, e.raw, w)
	mustExec(t, c, "SELECT pg_advisory_lock(14)") // a session lock in the same block
	mustExec(t, c, "COMMIT")
	assertTracked(t, e.raw, w)
	if n := heldCount(t, e.raw, 13); n != 0 {
		t.Fatalf("xact lock after COMMIT: %d holders", n)
	}
	mustExec(t, c, "SELECT pg_advisory_unlock(14)")
	c.Close()
	if s := e.wrapped.Stats(); s.InUse != 0 || s.Idle < 1 {
		t.Errorf("pool after the text transactions: %+v", s)
	}
	if _, err := e.wrapped.ExecContext(ctx, "SELECT pg_advisory_xact_lock(15)"); err == nil || !strings.Contains(err.Error(), "protects nothing") {
		t.Fatalf("a lone autocommit xact lock: %v", err)
	}
}

// 8b. PostgreSQL's own advisory-lock regression sequence (in the shape of
// src/test/regress/sql/advisory_lock.sql), replayed statement by statement
// on a raw and a lockhooks connection: after every statement both backends
// hold the same locks, and lockhooks' view equals pg_locks. lockhooks may
// refuse an unlock that Postgres answers false (ErrNotLockOwner): the lock
// state is the same either way.
func TestRegressionScriptReplay(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	raw, wrapped := otherConn(t, e.raw), otherConn(t, e.wrapped)
	rawPID := pidOf(t, raw)
	w := trackedConn(t, wrapped)
	xact := "SELECT pg_advisory_xact_lock(1), pg_advisory_xact_lock_shared(2), pg_advisory_xact_lock(1, 1), pg_advisory_xact_lock_shared(2, 2)"
	session := "SELECT pg_advisory_lock(1), pg_advisory_lock_shared(2), pg_advisory_lock(1, 1), pg_advisory_lock_shared(2, 2)"
	unlockOnce := "SELECT pg_advisory_unlock(1), pg_advisory_unlock_shared(2), pg_advisory_unlock(1, 1), pg_advisory_unlock_shared(2, 2)"
	unlockTwice := "SELECT pg_advisory_unlock(1), pg_advisory_unlock(1), pg_advisory_unlock_shared(2), pg_advisory_unlock_shared(2), pg_advisory_unlock(1, 1), pg_advisory_unlock(1, 1), pg_advisory_unlock_shared(2, 2), pg_advisory_unlock_shared(2, 2)"
	script := []string{
		"BEGIN", xact, "SELECT pg_advisory_unlock_all()", unlockOnce, "COMMIT",
		"BEGIN", xact, session, "ROLLBACK", unlockTwice,
		"BEGIN", session, xact, "ROLLBACK", unlockOnce,
		"BEGIN", xact, xact, "ROLLBACK",
		session, session, unlockTwice,
		session, session, "SELECT pg_advisory_unlock_all()",
		"BEGIN", "SELECT pg_advisory_xact_lock(1), pg_advisory_xact_lock(1)", "COMMIT",
		"SELECT pg_advisory_lock(1), pg_advisory_lock(1, 1)", "DISCARD ALL",
		"SELECT pg_try_advisory_lock(5), pg_try_advisory_lock_shared(6), pg_try_advisory_lock(5, 5)",
		"SELECT pg_advisory_unlock(5), pg_advisory_unlock_shared(6), pg_advisory_unlock(5, 5)",
	}
	// The two sessions would block each other: raw runs first, and its lock
	// state after each step is what lockhooks must reproduce.
	var want []map[lockKey]bool
	for i, stmt := range script {
		if _, err := raw.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("step %d %q: raw: %v", i, stmt, err)
		}
		want = append(want, serverLocks(t, e.raw, rawPID))
	}
	mustExec(t, raw, "SELECT pg_advisory_unlock_all()")
	if left := serverLocks(t, e.raw, rawPID); len(left) != 0 {
		t.Fatalf("the raw session still holds %s", describeKeys(left))
	}
	for i, stmt := range script {
		if _, err := wrapped.ExecContext(ctx, stmt); err != nil && !errors.Is(err, ErrNotLockOwner) {
			t.Fatalf("step %d %q: lockhooks: %v", i, stmt, err)
		}
		got := serverLocks(t, e.raw, w.view().pid)
		if describeKeys(want[i]) != describeKeys(got) {
			t.Fatalf("step %d %q: raw held %s, lockhooks' backend holds %s", i, stmt, describeKeys(want[i]), describeKeys(got))
		}
		if tracked := keysOf(w.view()); describeKeys(tracked) != describeKeys(got) {
			t.Fatalf("step %d %q: lockhooks tracks %s, pg_locks shows %s", i, stmt, describeKeys(tracked), describeKeys(got))
		}
	}
}

// Locks taken where no text shows them (a server-side function) are found
// only with WithVerifyOnReturn: the connection is then parked on return.
func TestVerifyOnReturnFindsLocksTakenInFunctions(t *testing.T) {
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprint("verify=", verify), func(t *testing.T) {
			e := newPinEnv(t, WithVerifyOnReturn(verify))
			mustExec(t, e.wrapped, `CREATE FUNCTION take_job(k bigint) RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_lock(k)'`)
			mustExec(t, e.wrapped, "SELECT take_job(801)")
			s := e.wrapped.Stats()
			if !verify {
				// Documented: without the option the lock goes back to the
				// pool unseen (as with the raw driver).
				if s.Idle != 1 {
					t.Fatalf("pool: %+v", s)
				}
				mustExec(t, e.raw, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = 801")
				return
			}
			if s.Idle != 0 || len(e.parkedViews(t)) != 1 {
				t.Fatalf("the holder was not parked: %+v", s)
			}
			if ok, err := unlock(t, e.wrapped, 801); !ok || err != nil {
				t.Fatalf("unlock through the pool: %v, %v", ok, err)
			}
			if n := heldCount(t, e.raw, 801); n != 0 {
				t.Fatalf("%d holders", n)
			}
		})
	}
}

// TryLock on Postgres holds all of its keys or none, and never a session
// lock: a key held elsewhere makes it give back those it got.
func TestPostgresTryLockIsAllOrNone(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	other := otherConn(t, e.raw)
	tx, err := e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ok, err := TryLock(ctx, tx, "jobs", 1, 2, 3)
	if err != nil || !ok {
		t.Fatalf("TryLock of free keys: %v, %v", ok, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	keys := locksetKeysOf(t, e.wrapped, "jobs", 1, 2, 3)
	mustExec(t, other, "SELECT pg_advisory_lock($1)", keys[1])
	tx, err = e.wrapped.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, err = TryLock(ctx, tx, "jobs", 1, 2, 3)
	if err != nil || ok {
		t.Fatalf("TryLock with a key held elsewhere: %v, %v", ok, err)
	}
	var mine int
	if err := tx.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&mine); err != nil {
		t.Fatalf("the transaction is not usable after a failed TryLock: %v", err)
	}
	if mine != 0 {
		t.Fatalf("a failed TryLock left %d keys held", mine)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if parked := e.parkedViews(t); len(parked) != 0 {
		t.Fatalf("TryLock left session locks: %+v", parked)
	}
	mustExec(t, other, "SELECT pg_advisory_unlock($1)", keys[1])
}

// locksetKeysOf returns the Postgres keys of Lock(namespace, ids...).
func locksetKeysOf(t testing.TB, db *sql.DB, namespace string, ids ...any) []int64 {
	t.Helper()
	canon, err := lockset.CanonicalIDs(ids)
	if err != nil {
		t.Fatal(err)
	}
	return lockset.AdvisoryKeys(namespace, canon, LockID)
}

// A rerouted unlock runs with a context of its own: the caller's deadline
// passing while it waits does not cut the statement on the holder (which
// would make pgx close it, losing its other locks).
func TestRerouteIgnoresTheCallersDeadline(t *testing.T) {
	e := newPinEnv(t)
	mustExec(t, e.wrapped, "SELECT pg_advisory_lock(901), pg_advisory_lock(902)")
	parked := e.parkedViews(t)
	if len(parked) != 1 {
		t.Fatalf("parked: %+v", parked)
	}
	var holder *conn
	for _, w := range e.connector(t).Conns() {
		if w.view().parked {
			holder = w
		}
	}
	holder.pin.Exec.Lock() // the holder is busy with another reroute
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		var ok bool
		done <- e.wrapped.QueryRowContext(ctx, "SELECT pg_advisory_unlock(901)").Scan(&ok)
	}()
	<-ctx.Done()
	holder.pin.Exec.Unlock()
	err := <-done
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("rerouted unlock: %v", err)
	}
	if holder.view().lost {
		t.Fatal("the holder's locks were lost")
	}
	if n := heldCount(t, e.raw, 902); n != 1 {
		t.Fatalf("the holder's other lock: %d holders", n)
	}
	waitFor(t, 10*time.Second, "the unlock of 901 to land", func() bool { return heldCount(t, e.raw, 901) == 0 })
	if ok, err := unlock(t, e.wrapped, 902); !ok || err != nil {
		t.Fatal(ok, err)
	}
}

// db.Close while other goroutines reroute unlocks to parked holders: no
// race (under -race), no panic, and nothing left afterwards.
func TestCloseDuringReroutes(t *testing.T) {
	e := newPinEnv(t)
	const n = 8
	for k := range n {
		mustExec(t, e.wrapped, "SELECT pg_advisory_lock($1)", int64(1000+k))
	}
	start := make(chan struct{})
	done := make(chan struct{}, n)
	for k := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			<-start
			var ok bool
			e.wrapped.QueryRow("SELECT pg_advisory_unlock($1)", int64(1000+k)).Scan(&ok)
		}()
	}
	close(start)
	e.wrapped.Close()
	for range n {
		<-done
	}
	assertNothingLeft(t, e.raw, e.app)
}

// Found by review: inputs where the tracking once diverged or a direct
// connection was taken for a pooler.
func TestReviewFoundInputs(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	t.Run("a count the text cannot show, then an unlock", func(t *testing.T) {
		c := otherConn(t, e.wrapped)
		mustExec(t, c, "SELECT pg_advisory_lock(1) FROM generate_series(1, 2)") // taken twice; pg_locks shows it once
		if _, err := c.ExecContext(ctx, "SELECT pg_advisory_unlock(1)"); err != nil {
			t.Fatalf("unlock after an unreadable count: %v", err)
		}
		w := trackedConn(t, c)
		assertTracked(t, e.raw, w)
		if w.view().lost {
			t.Fatal("a direct connection was reported lost")
		}
		mustExec(t, c, "SELECT pg_advisory_unlock_all()")
	})
	t.Run("BEGIN and an xact lock in one text on a fresh connection", func(t *testing.T) {
		c := otherConn(t, e.wrapped)
		mustExec(t, c, "BEGIN; SELECT pg_advisory_xact_lock(2)")
		w := trackedConn(t, c)
		assertTracked(t, e.raw, w)
		mustExec(t, c, "COMMIT")
		assertTracked(t, e.raw, w)
		if w.holdsLocks() {
			t.Fatal("a transaction-level lock was kept as a session lock")
		}
	})
	t.Run("Release with a cancelled context", func(t *testing.T) {
		l, err := AcquireAdvisoryLock(ctx, e.wrapped, 3)
		if err != nil {
			t.Fatal(err)
		}
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := l.Release(done); err != nil {
			t.Fatalf("Release(cancelled ctx): %v", err)
		}
		if n := heldCount(t, e.raw, 3); n != 0 {
			t.Fatalf("%d holders after Release with a cancelled context", n)
		}
		l, err = AcquireAdvisoryLock(ctx, e.wrapped, 3)
		if err != nil {
			t.Fatalf("the next acquire: %v", err)
		}
		l.Release(ctx)
	})
}
