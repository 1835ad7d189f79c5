package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorylock"
)

// A statement on an AdvisoryLock's own connection that releases its key is
// a loss: Lost is closed before the statement returns, Err and the next
// statement on the connection wrap ErrLockLost with the cause, the loss is
// logged and counted, and Release reports it and gives the connection up
// (closed: the other locks taken on it go with it). Each case proves on
// the server that the key was really free, by taking it from another
// session. Statements that leave the key held (an unlock of a stacked
// acquisition, of another key or of another mode, RESET ALL) are not.
func TestAdvisoryReleasedUnderLockIsALoss(t *testing.T) {
	const k = 4242
	for _, c := range []struct {
		name   string
		before []string // statements on l.Conn() that leave k held
		stmt   string   // the statement that releases k
		other  int64    // a key taken on l.Conn() beforehand, which the loss must leave held until Release
		fails  bool     // the statement fails after its unlock ran
		then   string   // run after stmt: the loss is known once it returns (stmt aborted a transaction, where pg_locks cannot be read)
	}{
		{name: "pg_advisory_unlock", stmt: "SELECT pg_advisory_unlock(4242)"},
		{name: "pg_advisory_unlock_all", stmt: "SELECT pg_advisory_unlock_all()"},
		{name: "DISCARD ALL", stmt: "DISCARD ALL"},
		// The key is an expression lockhooks evaluates apart, then confirms
		// in pg_locks.
		{name: "expression key", stmt: "SELECT pg_advisory_unlock(4200 + 42)"},
		// Not a target list, nor text lockhooks can read: only the pg_locks
		// read after it tells that k is gone.
		{name: "unlock in a FROM", stmt: "SELECT pg_advisory_unlock(4242) FROM generate_series(1, 1)"},
		{name: "unlock in a DO block", stmt: "DO $$ BEGIN PERFORM pg_advisory_unlock(4242); END $$"},
		// Taken twice on l.Conn(): the first unlock leaves it held, the
		// second releases it.
		{name: "stacked lock", before: []string{"SELECT pg_advisory_lock(4242)", "SELECT pg_advisory_unlock(4242)"},
			stmt: "SELECT pg_advisory_unlock(4242)"},
		// Other keys and modes on l.Conn() come and go without a loss; the
		// release of k among other calls is one.
		{name: "among other calls", before: []string{
			"SELECT pg_advisory_lock(4343)", "SELECT pg_advisory_unlock(4343)",
			"SELECT pg_advisory_lock_shared(4242)", "SELECT pg_advisory_unlock_shared(4242)",
			"RESET ALL",
		}, stmt: "SELECT pg_advisory_lock(4444), pg_advisory_unlock(4242)", other: 4444},
		// The unlock runs, then the statement fails: the pg_locks read of
		// the error path finds k gone.
		{name: "failed statement", stmt: "SELECT pg_advisory_unlock(4242), ('x' || pg_backend_pid())::int", fails: true},
		{name: "failed statement in a transaction", before: []string{"BEGIN"},
			stmt: "SELECT pg_advisory_unlock(4242), ('x' || pg_backend_pid())::int", fails: true, then: "ROLLBACK"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			e := newPinEnv(t, WithLockCheckInterval(time.Hour)) // only the statement may find it out
			other := otherConn(t, e.raw)
			l, err := AcquireAdvisoryLock(ctx, e.wrapped, k)
			if err != nil {
				t.Fatal(err)
			}
			pid := pidOf(t, l.Conn())
			for _, q := range c.before {
				mustExec(t, l.Conn(), q)
				stillHeld(t, l, other, k, q)
			}
			if _, err := l.Conn().ExecContext(ctx, c.stmt); (err != nil) != c.fails || errors.Is(err, ErrLockLost) {
				t.Fatalf("%s: %v (want it to fail: %v, with the server's error)", c.stmt, err, c.fails)
			}
			if c.then != "" {
				mustExec(t, l.Conn(), c.then)
			}
			select {
			case <-l.Lost():
			default:
				t.Fatalf("Lost() is open right after %s released the lock on its own connection", c.stmt)
			}
			if !tryLock(t, other, k) {
				t.Fatalf("another session cannot take %d after %s: the server still holds it", k, c.stmt)
			}
			err = l.Err()
			if !errors.Is(err, ErrLockLost) {
				t.Fatalf("Err() = %v, want ErrLockLost", err)
			}
			stmt := c.stmt
			if c.then != "" {
				stmt = "a statement of the transaction that just ended"
			}
			mentions(t, "Err()", err.Error(), "advisory lock 4242", "released by a statement on its own connection", stmt, "Release")
			_, err = l.Conn().ExecContext(ctx, "SELECT 1")
			if !errors.Is(err, ErrLockLost) || !strings.Contains(err.Error(), advisorylock.ReleasedOnOwnConn) {
				t.Fatalf("the next statement on the lock's connection: %v, want ErrLockLost for the release", err)
			}
			t.Logf("Err(): %v", err)
			line := logLine(t, e.log, "advisory lock lost")
			mentions(t, "the log line", line, "keys=4242", advisorylock.ReleasedOnOwnConn)
			if got := counterValue(t, e.metrics, "lockhooks.lock.lost"); got != 1 {
				t.Errorf("lockhooks.lock.lost = %d, want 1", got)
			}
			if c.other != 0 && heldCount(t, e.raw, c.other) != 1 {
				t.Errorf("key %d, taken on the lock's connection, is not held before Release", c.other)
			}
			if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
				t.Fatalf("Release after the release: %v, want ErrLockLost", err)
			}
			// Release closed the lost connection: its backend, and any key
			// it still held, are gone; k stays the other session's.
			waitFor(t, 10*time.Second, "the lock's backend to exit", func() bool { return !backendAlive(t, e.raw, pid) })
			if c.other != 0 && heldCount(t, e.raw, c.other) != 0 {
				t.Errorf("key %d is still held after Release closed its connection", c.other)
			}
			if heldCount(t, e.raw, k) != 1 {
				t.Errorf("key %d is not held by the other session any more", k)
			}
			mustExec(t, e.wrapped, "SELECT 1") // the pool still works
			mustExec(t, other, "SELECT pg_advisory_unlock($1)", k)
		})
	}
}

// Statements on an AdvisoryLock's connection that release nothing of its
// key are not losses: an unlock of a key or mode the connection does not
// hold (refused, as through any connection), RESET ALL (it ends no lock:
// the server still holds the key), an unlock of one of two acquisitions.
// Release then unlocks the key, and nothing else.
func TestAdvisoryNotReleasedUnderLock(t *testing.T) {
	const k = 4545
	ctx := context.Background()
	e := newPinEnv(t, WithLockCheckInterval(time.Hour))
	other := otherConn(t, e.raw)
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"SELECT pg_advisory_unlock(4546)", "SELECT pg_advisory_unlock_shared(4545)"} {
		if _, err := l.Conn().ExecContext(ctx, q); !errors.Is(err, ErrNotLockOwner) {
			t.Errorf("%s: %v, want ErrNotLockOwner", q, err)
		}
		stillHeld(t, l, other, k, q)
	}
	for _, q := range []string{"RESET ALL", "SELECT pg_advisory_lock(4545)", "SELECT pg_advisory_lock(4546)", "SELECT pg_advisory_unlock(4545)"} {
		mustExec(t, l.Conn(), q)
		stillHeld(t, l, other, k, q)
	}
	if got := counterValue(t, e.metrics, "lockhooks.lock.lost"); got != 0 {
		t.Errorf("lockhooks.lock.lost = %d, want 0", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if heldCount(t, e.raw, k) != 0 || heldCount(t, e.raw, 4546) != 1 {
		t.Errorf("after Release: %d holders of %d (want 0), %d of 4546 (want 1: taken on the connection, not Release's)",
			heldCount(t, e.raw, k), k, heldCount(t, e.raw, 4546))
	}
	if strings.Contains(e.log.String(), "advisory lock lost") {
		t.Errorf("a loss was logged:\n%s", e.log)
	}
}

// stillHeld fails t unless, after statement q, l is not lost, its
// connection still runs statements and the server still holds k for it
// (another session cannot take it).
func stillHeld(t *testing.T, l *AdvisoryLock, other *sql.Conn, k int64, q string) {
	t.Helper()
	select {
	case <-l.Lost():
		t.Fatalf("Lost() closed after %s, which left the lock held: %v", q, l.Err())
	default:
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err() after %s: %v", q, err)
	}
	if tryLock(t, other, k) {
		t.Fatalf("another session took %d after %s", k, q)
	}
	mustExec(t, l.Conn(), "SELECT 1")
}

// tryLock tries k on c (a raw connection).
func tryLock(t *testing.T, c *sql.Conn, k int64) bool {
	t.Helper()
	var ok bool
	if err := c.QueryRowContext(context.Background(), "SELECT pg_try_advisory_lock($1)", k).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}
