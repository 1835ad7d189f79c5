package lockhooks

// Faults through a transaction pooler (PgBouncer): failed acquires, lost holders,
// crashes and admin KILLs of the pooler, a silent network at Close, and the
// guard that sees an undeclared pooler.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/faultproxy"
	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// newOwnPoolerEnv is newPoolerEnv through a PgBouncer of the test's own,
// started after the database was created, so that it stops before the
// database is dropped. Tests that end server connections need one:
// PgBouncer 1.18 crashes ("server in bad state") when a server connection
// it is sending a cancel request for (pgx sends one whenever it gives up on
// a connection) is ended under it, by pg_terminate_backend or by the
// drop, and the shared PgBouncer must outlive every test of the binary.
func newOwnPoolerEnv(t *testing.T, opts pgtest.PoolerOptions) (*poolerEnv, *pgtest.Pooler) {
	t.Helper()
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := pgtest.StartPooler(t, opts)
	e := &poolerEnv{direct: dsn, pooled: p.DSNFor(strings.TrimPrefix(u.Path, "/")), log: &syncBuffer{},
		app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}
	if e.raw, err = sql.Open("pgx", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.raw.Close() })
	return e, p
}

// newPoolerFaultEnv is newOwnPoolerEnv whose pooled DSN reaches PgBouncer
// through a fault-injecting proxy.
func newPoolerFaultEnv(t *testing.T) (*poolerEnv, *faultproxy.Proxy) {
	t.Helper()
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	var proxy *faultproxy.Proxy
	e.pooled, proxy = throughFaultProxy(t, e.pooled)
	return e, proxy
}

// Point 4, through a transaction pooler: an acquire that fails after the
// holder took the lock. The case is TryAdvisoryLock's context
// ending while the holder runs the try-lock's third round trip (RELEASE
// SAVEPOINT): the holder has the lock, and database/sql then reports the
// context's error when its rows' context watcher wins the race with Scan,
// which no test can force. What that race reaches is the failed acquire's
// cleanup, driven here on a lock the holder really took: the key is
// unlocked on the server, the connection goes back, and the process's next
// acquirer takes the key.
func TestPoolerFailedAcquireLeavesNothing(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	l, ok, err := TryAdvisoryLock(ctx, db, 84)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	l.lock.Abandon() // as acquire does when LockOnServer failed
	l.c.connector.Turns.Unlock(l.lock.Key, l.turn)
	e.waitNoAdvisoryLocks(t)
	if s := db.Stats(); s.InUse != 0 {
		t.Errorf("%d connections still in use after the failed acquire", s.InUse)
	}
	l, ok, err = TryAdvisoryLock(ctx, db, 84)
	if err != nil || !ok {
		t.Fatalf("the next acquirer of the process: %v, %v; want the key", ok, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Point 2: through a transaction pooler, the holder keeping the lock is
// terminated; the protected work's next statement, and the COMMIT of a
// transaction begun before, fail with ErrLockLost before they run (the
// monitor is off: the statements find out themselves).
func TestPoolerLostHolderStopsTheNextStatement(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler(), WithLockCheckInterval(time.Hour))
	mustExec(t, e.raw, "CREATE TABLE work (n int)")
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 91)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, l.Conn(), "INSERT INTO work VALUES (1)")
	tx, err := l.Conn().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO work VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	holder := l.c.pin.Hold.PID()
	terminate(t, e.raw, holder)
	waitFor(t, 20*time.Second, "the holder's backend to exit", func() bool { return !backendAlive(t, e.raw, holder) })
	if err := tx.Commit(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("COMMIT of the protected work after the holder died: %v, want ErrLockLost", err)
	}
	if _, err := l.Conn().ExecContext(ctx, "INSERT INTO work VALUES (3)"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a statement of the protected work after the holder died: %v, want ErrLockLost", err)
	}
	var n int
	if err := e.raw.QueryRow("SELECT count(*) FROM work WHERE n > 1").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written after the lock was lost (%v)", n, err)
	}
	lostWithin(t, l, time.Second)
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release: %v, want ErrLockLost", err)
	}
}

// Point 3: PgBouncer crashes (SIGKILL): the holder's connection is gone,
// the server's backend with it, and another session can take the key.
// Lost fires, although the monitor cannot open its side connection.
func TestPoolerCrashLosesTheLock(t *testing.T) {
	e, p := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 93)
	if err != nil {
		t.Fatal(err)
	}
	p.Crash(t)
	e.waitNoAdvisoryLocks(t)
	lostWithin(t, l, 20*time.Second)
	var got bool
	if err := e.raw.QueryRow("SELECT pg_try_advisory_lock(93)").Scan(&got); err != nil || !got {
		t.Fatalf("another session taking the key: %v, %v", got, err)
	}
	mustExec(t, e.raw, "SELECT pg_advisory_unlock_all()")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a statement of the protected work: %v, want ErrLockLost", err)
	}
}

// Point 3: PgBouncer's admin KILL drops the database's client and server
// connections, and new clients wait until RESUME: the monitor's side
// connection cannot be opened within its check timeout. Lost fires.
func TestPoolerAdminKillLosesTheLock(t *testing.T) {
	e, p := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(500*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 94)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := e.raw.QueryRow("SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	p.Admin(t, "KILL "+name)
	t.Cleanup(func() { p.Admin(t, "RESUME "+name) }) // runs before the cleanup of e.open (registered earlier)
	e.waitNoAdvisoryLocks(t)
	lostWithin(t, l, 20*time.Second)
	if !errors.Is(l.Err(), ErrLockLost) {
		t.Fatalf("Err() = %v", l.Err())
	}
}

// Point 9 through a transaction pooler: db.Close with a silent network
// between lockhooks and PgBouncer returns promptly, without the holders'
// unlock-and-COMMIT round trips; once the connections go, PgBouncer drops
// the holders' server connections (their clients left in the middle of a
// transaction) and the locks with them.
func TestPoolerCloseWithASilentNetworkIsPrompt(t *testing.T) {
	e, proxy := newPoolerFaultEnv(t)
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(time.Minute))
	ctx := context.Background()
	if _, err := AcquireAdvisoryLock(ctx, db, 106); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "SELECT pg_advisory_lock(107)") // a parked holder too
	proxy.SetMode(faultproxy.BlackHole)
	proxy.BlackHoleAll()
	time.Sleep(200 * time.Millisecond) // the monitor is inside a check by now (the test holds either way)
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("db.Close did not return within 30s with a silent network")
	}
	t.Logf("db.Close returned after %v", time.Since(start))
	proxy.Close()
	e.waitNoAdvisoryLocks(t)
}

// Point 10: through a transaction pooler, a blocking AcquireAdvisoryLock
// polls the server; db.Close stops it at once, with an error.
func TestPoolerAcquireStopsAtClose(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithTransactionPooler())
	blocker := otherConn(t, e.raw)
	mustExec(t, blocker, "SELECT pg_advisory_lock(99)")
	done := make(chan error, 1)
	go func() {
		l, err := AcquireAdvisoryLock(context.Background(), db, 99)
		if err == nil {
			l.Release(context.Background())
			err = errors.New("acquired")
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // it polls by now (the test holds either way)
	db.Close()
	select {
	case err := <-done:
		if !strings.Contains(fmt.Sprint(err), "database was closed") {
			t.Fatalf("AcquireAdvisoryLock after db.Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("AcquireAdvisoryLock kept polling after db.Close")
	}
	mustExec(t, blocker, "SELECT pg_advisory_unlock(99)")
}

// Measured after the list: the undeclared-pooler guard never sleeps. A
// session lock taken through PgBouncer's transaction mode, on a database
// not opened with WithTransactionPooler, while the pool is idle (its lock
// statement and the read after it run on the backend the connection was
// opened on, so nothing looks wrong yet): it is reported lost with
// ErrTransactionPooler at once (the monitor's first look, on another
// client connection, lands on the holder's backend; the periodic check is
// off here), before other clients share that backend; the holder's next
// statement fails, and the database refuses session locks from then on.
func TestUndeclaredPoolerWithAnIdlePoolIsReported(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{}) // idle: no other test's clients
	db := e.open(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 101)
	if err != nil {
		t.Fatalf("the lock through an idle pool: %v", err)
	}
	pid := l.c.pin.PID.Load()
	t.Cleanup(func() { mustExec(t, e.raw, "SELECT pg_terminate_backend($1)", pid) }) // the stranded lock
	lostWithin(t, l, 20*time.Second)
	if !errors.Is(l.Err(), ErrTransactionPooler) || !strings.Contains(l.Err().Error(), "WithTransactionPooler") {
		t.Fatalf("Err() = %v, want ErrTransactionPooler naming the option", l.Err())
	}
	// Other clients share the backend now; the holder's work must not run.
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	mustExec(t, other, "SELECT 1")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("the holder's next statement: %v, want ErrLockLost and ErrTransactionPooler", err)
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(102)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a new session lock: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 102); n != 0 {
		t.Fatalf("the refused lock was taken (%d holders)", n)
	}
	l.Release(ctx)
}

// The guard at connect: a second connection of the database opens on the
// backend where the first, still open, left its marker (PgBouncer reuses
// the idle server connection): only a transaction-mode pooler does that,
// so the first connection's session lock is refused before it runs.
func TestUndeclaredPoolerSeenAtConnect(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{})
	db := e.open(t, WithLockCheckInterval(time.Hour))
	ctx := context.Background()
	c1 := otherConn(t, db)
	c2 := otherConn(t, db)
	if pid1, pid2 := trackedConn(t, c1).pin.PID.Load(), trackedConn(t, c2).pin.PID.Load(); pid1 != pid2 {
		t.Fatalf("the two connections opened on backends %d and %d; the test needs PgBouncer to reuse the idle one", pid1, pid2)
	}
	if _, err := c1.ExecContext(ctx, "SELECT pg_advisory_lock(103)"); !errors.Is(err, ErrTransactionPooler) {
		t.Fatalf("a session lock after the pooler was seen: %v, want ErrTransactionPooler", err)
	}
	if n := heldCount(t, e.raw, 103); n != 0 {
		t.Fatalf("the refused lock was taken (%d holders)", n)
	}
	// Transaction-level locks are fine through the pooler.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := Lock(ctx, tx, "jobs", 1); err != nil {
		t.Fatalf("Lock through the pooler: %v", err)
	}
}

// Point 3's limit: a pooler whose server connections are all taken (the
// holder's, and another client's open transaction; default_pool_size = 2)
// keeps the monitor's check waiting for a server until the check's timeout.
// The pooler answered the connection, so the server is reachable, only
// busy: the holder is not reported lost.
func TestBusyPoolerIsNotUnreachable(t *testing.T) {
	e, _ := newOwnPoolerEnv(t, pgtest.PoolerOptions{PoolSize: 2})
	db := e.open(t, WithTransactionPooler(), withCheckTimeout(300*time.Millisecond))
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, db, 109)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	busy, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Rollback()
	mustExec(t, busy, "SELECT 1") // the pool's other server connection, kept
	waitFor(t, 30*time.Second, "two checks to time out waiting for a server", func() bool {
		return strings.Count(e.log.String(), "checking advisory-lock holders failed") >= 2
	})
	select {
	case <-l.Lost():
		t.Fatalf("the holder was reported lost: %v", l.Err())
	default:
	}
	busy.Rollback()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
