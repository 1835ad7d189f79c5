package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// sessionPoolerEnv is a fresh database reached directly and through a
// PgBouncer of version v in session mode, with room for every client
// connection of the test (in session mode each client keeps a server
// connection until it disconnects).
func sessionPoolerEnv(t *testing.T, v pgtest.Version) *poolerEnv {
	t.Helper()
	return newPoolerEnv(t, pgtest.StartPooler(t, pgtest.PoolerOptions{Version: v, Mode: "session", PoolSize: 20}))
}

// eachSessionPooler runs f once per PgBouncer version of the test matrix,
// each in session mode.
func eachSessionPooler(t *testing.T, f func(t *testing.T, e *poolerEnv)) {
	pgtest.EachPooler(t, func(t *testing.T, shared *pgtest.Pooler) { f(t, sessionPoolerEnv(t, shared.Version())) })
}

// Through PgBouncer in session mode a client keeps its server connection,
// so session locks work as on a direct connection, without any option and
// without a false ErrTransactionPooler: locks parked on the pool and
// unlocked through it, AcquireAdvisoryLock from two replicas for mutual
// exclusion, other clients' work meanwhile.
func TestSessionPoolerNeedsNoOption(t *testing.T) {
	eachSessionPooler(t, func(t *testing.T, e *poolerEnv) {
		ctx := context.Background()
		db := e.open(t)
		if _, err := db.Exec("SELECT pg_advisory_lock(1)"); err != nil {
			t.Fatal(err)
		}
		mustExec(t, e.raw, "CREATE TABLE counter (n int)")
		mustExec(t, e.raw, "INSERT INTO counter VALUES (0)")
		replicas := []*sql.DB{e.open(t), e.open(t)}
		var wg sync.WaitGroup
		for _, r := range replicas {
			for range 2 {
				wg.Go(func() {
					for range 5 {
						l, err := AcquireAdvisoryLock(ctx, r, LockID("counter"))
						if err != nil {
							t.Error(err)
							return
						}
						var n int
						if err := l.Conn().QueryRowContext(ctx, "SELECT n FROM counter").Scan(&n); err != nil {
							t.Error(err)
						}
						if _, err := l.Conn().ExecContext(ctx, "UPDATE counter SET n = $1", n+1); err != nil {
							t.Error(err)
						}
						if err := l.Release(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Go(func() { // other work through the same pool
				for range 10 {
					var one int
					if err := r.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		var n int
		if err := e.raw.QueryRow("SELECT n FROM counter").Scan(&n); err != nil || n != 2*2*5 {
			t.Fatalf("counter = %d (%v), want %d", n, err, 2*2*5)
		}
		var ok bool
		if err := db.QueryRow("SELECT pg_advisory_unlock(1)").Scan(&ok); err != nil || !ok {
			t.Fatalf("unlock through the pool: %v, %v", ok, err)
		}
		if strings.Contains(e.log.String(), "pooler") {
			t.Errorf("a session-mode pooler was reported:\n%s", e.log)
		}
	})
}

// stateOf returns the lockhooks state of a connection of a lockhooks
// database.
func stateOf(t *testing.T, c *sql.Conn) *conn {
	t.Helper()
	var w *conn
	if err := c.Raw(func(dc any) error { w = dc.(connCore).state(); return nil }); err != nil {
		t.Fatal(err)
	}
	return w
}

// lastQuery is what pg_stat_activity says backend pid ran last.
func lastQuery(t *testing.T, raw *sql.DB, pid int32) string {
	t.Helper()
	var q string
	if err := raw.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil {
		t.Fatalf("backend %d: %v", pid, err)
	}
	return q
}

// With WithSessionPinningPooler a connection that held a session lock is
// closed once it holds none, instead of going back to the pool pinned: in
// PgBouncer's session mode its server connection is then reset (DISCARD
// ALL, server_reset_query) and free for the next client. Without the
// option the connection goes back to the pool, still pinned to its server
// connection. Both for AcquireAdvisoryLock and a lock and unlock on a
// *sql.Conn.
func TestSessionPinningPoolerRecyclesConnections(t *testing.T) {
	eachSessionPooler(t, func(t *testing.T, e *poolerEnv) {
		ctx := context.Background()
		for _, declared := range []bool{false, true} {
			var opts []Option
			if declared {
				opts = append(opts, WithSessionPinningPooler())
			}
			db := e.open(t, opts...)
			db.SetMaxIdleConns(4)
			l, err := AcquireAdvisoryLock(ctx, db, 7)
			if err != nil {
				t.Fatal(err)
			}
			pid := l.c.pin.PID.Load()
			mustExec(t, l.Conn(), "SELECT 1")
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, c, "SELECT pg_advisory_lock(8)")
			mustExec(t, c, "SELECT pg_advisory_unlock(8)")
			pid2 := stateOf(t, c).pin.PID.Load()
			c.Close()
			if !declared {
				if n := db.Stats().OpenConnections; n == 0 || pid2 != pid {
					t.Errorf("undeclared: %d connections open, the lock's backend %d, the next connection's %d; want the pinned connection pooled and reused", n, pid, pid2)
				}
				if q := lastQuery(t, e.raw, pid); strings.Contains(q, "DISCARD") {
					t.Errorf("undeclared: the server connection was reset (%q)", q)
				}
				db.Close()
				continue
			}
			if n := db.Stats().OpenConnections; n != 0 {
				t.Errorf("declared: %d connections still open after the last unlock; want them closed", n)
			}
			for _, p := range []int32{pid, pid2} {
				waitFor(t, 10*time.Second, "PgBouncer to reset the server connection of the closed client", func() bool {
					return lastQuery(t, e.raw, p) == "DISCARD ALL"
				})
			}
		}
		if strings.Contains(e.log.String(), "pooler") {
			t.Errorf("a pooler was reported:\n%s", e.log)
		}
	})
}

// A session-pinning pooler (RDS Proxy) runs a connection's statements on
// any server connection until it takes a session lock. Emulated here with
// PgBouncer's transaction mode and a deterministic hand-over (see
// pgtest's handOver): the connection met backend S1 at connect and takes its
// lock on S2. With WithSessionPinningPooler the lock is followed on S2, with
// no false ErrTransactionPooler; once it holds a lock the connection must
// stay there, and a pooler that moves it (transaction mode does) is caught.
func TestSessionPinningPoolerFollowsTheBackend(t *testing.T) {
	pgtest.EachPooler(t, func(t *testing.T, p *pgtest.Pooler) {
		e := newPoolerEnv(t, p)
		db := e.open(t, WithSessionPinningPooler())
		ctx := context.Background()
		c, err := db.Conn(ctx) // met S1 at connect
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s1 := stateOf(t, c).pin.PID.Load()
		other, err := sql.Open("pgx", e.pooled)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		tx, err := other.Begin() // takes S1
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var on int32
		if err := tx.QueryRow("SELECT pg_backend_pid()").Scan(&on); err != nil || on != s1 {
			t.Fatalf("the other client's transaction on %d (%v), want S1 = %d", on, err, s1)
		}
		mustExec(t, c, "SELECT pg_advisory_lock(11)") // on S2
		var s2 int32
		if err := e.raw.QueryRow("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 11").Scan(&s2); err != nil {
			t.Fatal(err)
		}
		if s2 == s1 {
			t.Fatalf("the lock was taken on S1 = %d; the hand-over did not move the connection", s1)
		}
		if got := stateOf(t, c).pin.PID.Load(); got != s2 {
			t.Errorf("the connection is followed on backend %d, its lock is on %d", got, s2)
		}
		var ok bool
		if err := c.QueryRowContext(ctx, "SELECT pg_advisory_unlock(11)").Scan(&ok); err != nil || !ok {
			t.Fatalf("unlock on the backend that holds the lock: %v, %v", ok, err)
		}
		// Pinned to S2 by a new lock; then the pooler gives S2 to another
		// client's transaction and the connection's next statement runs
		// elsewhere: this pooler does not pin, and that is reported.
		mustExec(t, c, "SELECT pg_advisory_lock(12)")
		tx2, err := other.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		if err := tx2.QueryRow("SELECT pg_backend_pid()").Scan(&on); err != nil || on != s2 {
			t.Fatalf("the other client's second transaction on %d (%v), want S2 = %d", on, err, s2)
		}
		if err := tx.Rollback(); err != nil { // S1 is free, S2 is not
			t.Fatal(err)
		}
		_, err = c.ExecContext(ctx, "SELECT pg_advisory_lock(13)")
		if !errors.Is(err, ErrTransactionPooler) || !strings.Contains(err.Error(), "does not pin") {
			t.Fatalf("a pinned connection moved to another backend: %v", err)
		}
		t.Log(err)
		tx2.Rollback()
		mustExec(t, e.raw, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid IN (12, 13)")
	})
}

// The two pooler options describe different poolers: Open refuses both.
func TestPoolerOptionsExclusive(t *testing.T) {
	_, err := Open("pgx", "postgres://localhost/x", WithTransactionPooler(), WithSessionPinningPooler())
	if !errors.Is(err, errPoolerOptions) {
		t.Fatalf("Open with both pooler options: %v", err)
	}
}
