package lockhooks

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

func TestLockIDMatchesDstack(t *testing.T) {
	for name, want := range map[string]int64{
		"global_exports": 6333502497592769007,
		"server_init":    7047472480246918123,
		"migrations":     8499576275731843811,
		"":               2636181500157147221,
	} {
		if got := LockID(name); got != want {
			t.Errorf("LockID(%q) = %d, want %d", name, got, want)
		}
	}
}

// pinEnv is a fresh database opened through lockhooks (with fast lock
// checks, a captured log, a metric reader and an application_name of its
// own) and through raw pgx.
type pinEnv struct {
	wrapped, raw *sql.DB
	app          string // the application_name of wrapped's backends
	log          *syncBuffer
	metrics      *sdkmetric.ManualReader
}

var appSeq atomic.Int64

func newPinEnv(t *testing.T, opts ...Option) *pinEnv {
	t.Helper()
	dsn := pgtest.DSN(t)
	e := &pinEnv{log: &syncBuffer{}, metrics: sdkmetric.NewManualReader(), app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}
	opts = append([]Option{
		WithLockCheckInterval(20 * time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(e.log, nil))),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.metrics))),
	}, opts...)
	var err error
	if e.wrapped, err = Open("pgx", withApp(dsn, e.app), opts...); err != nil {
		t.Fatal(err)
	}
	if e.raw, err = sql.Open("pgx", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.wrapped.Close()
		assertNothingLeft(t, e.raw, e.app)
		e.raw.Close()
	})
	return e
}

// withApp returns dsn with its application_name set to app.
func withApp(dsn, app string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "application_name=" + app
}

// assertNothingLeft is the invariant every Postgres test can end with:
// after db.Close returned, no backend of the database's application_name
// remains, so no advisory lock it took is held. Backends exit a moment
// after their socket closes, so it polls with a deadline.
func assertNothingLeft(t testing.TB, raw *sql.DB, app string) {
	t.Helper()
	var n, locks int
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := raw.QueryRow(`SELECT count(DISTINCT a.pid), count(l.pid) FROM pg_stat_activity a
			LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory'
			WHERE a.application_name = $1`, app).Scan(&n, &locks)
		if err != nil {
			t.Errorf("checking for leftover backends of %s: %v", app, err)
			return
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("after db.Close, %d backends of %s remain, holding %d advisory locks", n, app, locks)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// heldCount returns how many backends hold advisory key k (bigint form) in
// pg_locks.
func heldCount(t testing.TB, raw *sql.DB, k int64) int {
	t.Helper()
	var n int
	err := raw.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2`, k>>32, k&0xffffffff).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func unlock(t *testing.T, db interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, k int64) (bool, error) {
	t.Helper()
	var ok bool
	err := db.QueryRowContext(context.Background(), "SELECT pg_advisory_unlock($1)", k).Scan(&ok)
	return ok, err
}

// dstack issue 3881: lock with db.Exec, unlock with db.QueryRow on another
// pooled connection. Raw pgx answers false and leaves the lock on an idle
// connection; lockhooks runs the unlock on the connection that holds it.
func TestUnlockOnAnotherPooledConnection(t *testing.T) {
	const k = 3881
	e := newPinEnv(t)
	for _, c := range []struct {
		name    string
		db      *sql.DB
		want    bool
		wantErr bool
	}{
		{"raw", e.raw, false, false},
		{"lockhooks", e.wrapped, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := c.db.Exec("SELECT pg_advisory_lock($1)", k); err != nil {
				t.Fatal(err)
			}
			busy := otherConn(t, c.db) // raw: takes the idle holder, so the unlock goes elsewhere
			ok, err := unlock(t, c.db, k)
			if err != nil {
				t.Fatal(err)
			}
			if ok != c.want {
				t.Errorf("pg_advisory_unlock returned %v, want %v", ok, c.want)
			}
			busy.Close()
			held := heldCount(t, e.raw, k)
			if c.want && held != 0 {
				t.Errorf("pg_locks shows the lock held by %d backends after the unlock", held)
			}
			if !c.want && held != 1 {
				t.Errorf("raw: pg_locks shows %d holders, want the leaked 1", held)
			}
			if !c.want {
				e.raw.SetMaxIdleConns(0) // drop the leak
				e.raw.SetMaxIdleConns(2)
			}
		})
	}
}

// The same through a transaction: tx.Exec(lock); tx.Commit(); db.Exec(unlock).
func TestUnlockAfterTransactionCommit(t *testing.T) {
	const k = 77
	e := newPinEnv(t)
	tx, err := e.wrapped.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT pg_advisory_lock(77)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := e.wrapped.Stats().Idle; got != 0 {
		t.Errorf("the holder went back to the pool: %d idle", got)
	}
	holder := holderPID(t, e.raw, k)
	if _, err := e.wrapped.Exec("SELECT pg_advisory_unlock($1)", k); err != nil {
		t.Fatal(err)
	}
	if n := heldCount(t, e.raw, k); n != 0 {
		t.Errorf("lock still held by %d backends", n)
	}
	waitFor(t, 5*time.Second, "the parked connection to close", func() bool { return !backendAlive(t, e.raw, holder) })
}

// holderPID returns the pid of the backend holding advisory key k.
func holderPID(t testing.TB, raw *sql.DB, k int64) int32 {
	t.Helper()
	var pid int32
	if err := raw.QueryRow(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2`, k>>32, k&0xffffffff).Scan(&pid); err != nil {
		t.Fatalf("no holder of advisory lock %d: %v", k, err)
	}
	return pid
}

func TestReentrantSharedAndPairLocks(t *testing.T) {
	e := newPinEnv(t)
	db := e.wrapped
	t.Run("re-entrant", func(t *testing.T) {
		c := otherConn(t, db)
		mustExec(t, c, "SELECT pg_advisory_lock(5)")
		holder := holderPID(t, e.raw, 5)
		mustExec(t, c, "SELECT pg_advisory_lock(5)")
		c.Close() // parked with the lock taken twice
		if ok, err := unlock(t, db, 5); !ok || err != nil {
			t.Fatalf("first unlock: %v, %v", ok, err)
		}
		if n := heldCount(t, e.raw, 5); n != 1 {
			t.Fatalf("locked twice, unlocked once: %d holders, want 1", n)
		}
		if ok, err := unlock(t, db, 5); !ok || err != nil {
			t.Fatalf("second unlock: %v, %v", ok, err)
		}
		if n := heldCount(t, e.raw, 5); n != 0 {
			t.Fatalf("after both unlocks: %d holders", n)
		}
		waitFor(t, 5*time.Second, "the parked connection to close", func() bool { return !backendAlive(t, e.raw, holder) })
	})
	t.Run("shared on two connections", func(t *testing.T) {
		c1, c2 := otherConn(t, db), otherConn(t, db)
		for _, c := range []*sql.Conn{c1, c2} {
			mustExec(t, c, "SELECT pg_advisory_lock_shared(6)")
		}
		if n := heldCount(t, e.raw, 6); n != 2 {
			t.Fatalf("%d shared holders, want 2", n)
		}
		c1.Close()
		c2.Close() // both parked
		for range 2 {
			var ok bool
			if err := db.QueryRow("SELECT pg_advisory_unlock_shared(6)").Scan(&ok); err != nil || !ok {
				t.Fatalf("shared unlock: %v, %v", ok, err)
			}
		}
		if n := heldCount(t, e.raw, 6); n != 0 {
			t.Fatalf("%d shared holders left", n)
		}
		// An exclusive unlock does not release a shared lock.
		mustExec(t, db, "SELECT pg_advisory_lock_shared(6)")
		if _, err := unlock(t, db, 6); !errors.Is(err, ErrNotLockOwner) {
			t.Fatalf("exclusive unlock of a shared lock: %v, want ErrNotLockOwner", err)
		}
		mustExec(t, db, "SELECT pg_advisory_unlock_shared(6)")
	})
	t.Run("int4 pairs are their own key space", func(t *testing.T) {
		mustExec(t, db, "SELECT pg_advisory_lock(0, 7)")
		if _, err := unlock(t, db, 7); !errors.Is(err, ErrNotLockOwner) {
			t.Fatalf("bigint unlock of a pair lock: %v, want ErrNotLockOwner", err)
		}
		var ok bool
		if err := db.QueryRow("SELECT pg_advisory_unlock($1, $2)", 0, 7).Scan(&ok); err != nil || !ok {
			t.Fatalf("pair unlock: %v, %v", ok, err)
		}
	})
	t.Run("expression keys", func(t *testing.T) {
		mustExec(t, db, "SELECT pg_advisory_lock(hashtext('jobs'))")
		var ok bool
		if err := db.QueryRow("SELECT pg_advisory_unlock(hashtext($1))", "jobs").Scan(&ok); err != nil || !ok {
			t.Fatalf("unlock by expression: %v, %v", ok, err)
		}
		var n int
		if err := e.raw.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d advisory locks left (%v)", n, err)
		}
	})
}

func TestTryLocks(t *testing.T) {
	e := newPinEnv(t)
	holder := otherConn(t, e.raw)
	mustExec(t, holder, "SELECT pg_advisory_lock(9)")
	defer mustExec(t, holder, "SELECT pg_advisory_unlock(9)")

	var ok bool
	if err := e.wrapped.QueryRow("SELECT pg_try_advisory_lock(9)").Scan(&ok); err != nil || ok {
		t.Fatalf("try of a held lock: %v, %v", ok, err)
	}
	if s := e.wrapped.Stats(); s.Idle != 1 {
		t.Errorf("a failed try parked the connection: %d idle", s.Idle)
	}
	if _, err := e.wrapped.Exec("SELECT pg_try_advisory_lock(10)"); err != nil {
		t.Fatal(err)
	}
	if s := e.wrapped.Stats(); s.Idle != 0 {
		t.Errorf("a successful try did not park the connection: %d idle", s.Idle)
	}
	l, got, err := TryAdvisoryLock(context.Background(), e.wrapped, 9)
	if err != nil || got || l != nil {
		t.Fatalf("TryAdvisoryLock of a held key: %v, %v, %v", l, got, err)
	}
	if ok, err := unlock(t, e.wrapped, 10); !ok || err != nil {
		t.Fatalf("unlock of the tried lock: %v, %v", ok, err)
	}
}

// An unlock that cannot be honoured is an error naming the holder, never
// Postgres's silent false.
func TestUnlockNotOwnedIsAnError(t *testing.T) {
	e := newPinEnv(t)
	_, err := unlock(t, e.wrapped, 404)
	if !errors.Is(err, ErrNotLockOwner) || !strings.Contains(err.Error(), "no connection of this database holds") {
		t.Fatalf("unlock of a key nobody holds: %v", err)
	}
	l, err := AcquireAdvisoryLock(context.Background(), e.wrapped, 405)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	_, err = unlock(t, e.wrapped, 405)
	if !errors.Is(err, ErrNotLockOwner) || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "pg_pinning_test.go") {
		t.Fatalf("unlock of a key held by a connection in use: %v", err)
	}
}

func TestTransactionLevelLocks(t *testing.T) {
	e := newPinEnv(t)
	if _, err := e.wrapped.Exec("SELECT pg_advisory_xact_lock(11)"); err == nil || !strings.Contains(err.Error(), "outside a transaction") {
		t.Fatalf("xact lock outside a transaction: %v", err)
	}
	tx, err := e.wrapped.Begin()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "SELECT pg_advisory_xact_lock(11)")
	if n := heldCount(t, e.raw, 11); n != 1 {
		t.Fatalf("xact lock: %d holders", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := heldCount(t, e.raw, 11); n != 0 {
		t.Fatalf("xact lock after commit: %d holders", n)
	}
	if s := e.wrapped.Stats(); s.Idle != 1 {
		t.Errorf("a transaction-level lock parked the connection: %d idle", s.Idle)
	}
}

func TestAcquireAdvisoryLock(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, LockID("server_init"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Conn().PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	if n := heldCount(t, e.raw, l.Key()); n != 1 {
		t.Fatalf("%d holders", n)
	}
	// A second acquire waits; with a deadline it gives up cleanly.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := AcquireAdvisoryLock(short, e.wrapped, l.Key()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("contended acquire: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("a second Release succeeded")
	}
	// The cancelled waiter's backend may be granted the lock in the moment
	// before it reads the cancel and exits: wait for that to pass.
	waitFor(t, 10*time.Second, "no holder after Release", func() bool { return heldCount(t, e.raw, l.Key()) == 0 })
	// Release after the caller closed Conn(): rerouted to the parked holder.
	l, err = AcquireAdvisoryLock(ctx, e.wrapped, 12)
	if err != nil {
		t.Fatal(err)
	}
	l.Conn().Close()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after Conn().Close(): %v", err)
	}
	if n := heldCount(t, e.raw, 12); n != 0 {
		t.Fatalf("%d holders after Release", n)
	}
}

// Review 2, finding 5: the protected work leaves the lock's connection in
// an aborted transaction (BEGIN, then a failing statement), so Release's
// unlock fails. Release rolls the transaction back and unlocks, says so,
// and leaves nothing held: a second Release is refused, and this process's
// next acquirer takes the key at once.
func TestReleaseInAFailedTransactionRollsBackAndUnlocks(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 555)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, l.Conn(), "BEGIN")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	err = l.Release(ctx)
	if err == nil || !strings.Contains(err.Error(), "25P02") || !strings.Contains(err.Error(), "rolled back the connection's transaction") {
		t.Fatalf("Release in a failed transaction: %v; want the unlock's error and that lockhooks rolled back", err)
	}
	if n := heldCount(t, e.raw, 555); n != 0 {
		t.Fatalf("%d holders of 555 after Release", n)
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("a second Release succeeded")
	}
	next, ok, err := TryAdvisoryLock(ctx, e.wrapped, 555)
	if err != nil || !ok {
		t.Fatalf("the next acquirer: %v, %v; want the key", ok, err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Finding 5 where lockhooks cannot roll back: the caller closed Conn() in
// the failed transaction, so the connection is parked there and the
// rerouted unlock fails. Release closes the parked connection (which ends
// its session and the lock) instead of leaving it parked, and gives this
// process's next acquirer its turn only then.
func TestReleaseThatCannotUnlockClosesTheConnection(t *testing.T) {
	e := newPinEnv(t)
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, e.wrapped, 556)
	if err != nil {
		t.Fatal(err)
	}
	pid := l.c.pin.PID.Load()
	mustExec(t, l.Conn(), "BEGIN")
	if _, err := l.Conn().ExecContext(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 succeeded")
	}
	l.Conn().Close() // parked, in the failed transaction, holding 556

	// Another acquirer of this process waits for its turn meanwhile.
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		next, err := AcquireAdvisoryLock(wctx, e.wrapped, 556)
		if err == nil {
			err = next.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, 10*time.Second, "the next acquirer to wait for its turn", func() bool {
		n := 0
		l.c.connector.Turns.Waits(func(key int64, _ inprocess.Holder, _ sqlitelock.Waiting) {
			if key == 556 {
				n++
			}
		})
		return n > 0
	})

	err = l.Release(ctx)
	if err == nil || !strings.Contains(err.Error(), "25P02") || !strings.Contains(err.Error(), "closed it instead of returning it to the pool") {
		t.Fatalf("Release that cannot unlock: %v; want the unlock's error and that lockhooks closed the connection", err)
	}
	waitFor(t, 10*time.Second, "the parked holder's backend to exit", func() bool {
		var n int
		if err := e.raw.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if err := <-got; err != nil {
		t.Fatalf("the next acquirer: %v", err)
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("a second Release succeeded")
	}
}
