package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// poolerEnv is one fresh database reached directly and through a PgBouncer
// in transaction mode (pool size 2): p, or the shared 1.18 when p is nil.
type poolerEnv struct {
	direct string // DSN straight to Postgres
	pooled string // DSN through PgBouncer
	raw    *sql.DB
	app    string
	log    *syncBuffer
}

func newPoolerEnv(t *testing.T, p *pgtest.Pooler) *poolerEnv {
	t.Helper()
	direct := pgtest.DSN(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil {
		p = pgtest.SharedPooler(t)
	}
	e := &poolerEnv{direct: direct, pooled: p.Reach(t, strings.TrimPrefix(u.Path, "/")), log: &syncBuffer{},
		app: fmt.Sprintf("lockhooks_test_%d", appSeq.Add(1))}
	if e.raw, err = sql.Open("pgx", direct); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.raw.Close() })
	return e
}

// open opens the pooled DSN through lockhooks; the database is closed, and
// checked to leave no advisory lock behind, when the test ends.
func (e *poolerEnv) open(t *testing.T, opts ...Option) *sql.DB {
	t.Helper()
	opts = append([]Option{WithLockCheckInterval(50 * time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(e.log, nil)))}, opts...)
	db, err := Open("pgx", withApp(e.pooled, e.app), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		e.waitNoAdvisoryLocks(t)
	})
	return db
}

// waitNoAdvisoryLocks waits until no backend of the database holds an
// advisory lock (the pooler's server connections outlive its clients, so
// application_name does not find them).
func (e *poolerEnv) waitNoAdvisoryLocks(t testing.TB) {
	t.Helper()
	waitFor(t, 10*time.Second, "no advisory lock left in the database", func() bool {
		var n int
		if err := e.raw.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// The dstack issue 3881 shape through PgBouncer in transaction mode: a lock
// taken through db, other goroutines running transactions through the same
// pooler meanwhile, the unlock through db answers true; while held, a
// direct session cannot take the key.
func TestPoolerLockAndUnlockThroughThePool(t *testing.T) {
	pgtest.EachPooler(t, testPoolerLockAndUnlockThroughThePool)
}

func testPoolerLockAndUnlockThroughThePool(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	db := e.open(t, WithTransactionPooler())
	const k = 3881
	if _, err := db.Exec("SELECT pg_advisory_lock($1)", k); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				tx, err := db.Begin()
				if err != nil {
					t.Error(err)
					return
				}
				var one int
				if err := tx.QueryRow("SELECT 1").Scan(&one); err != nil {
					t.Error(err)
				}
				tx.Commit()
			}
		}()
	}
	wg.Wait()
	var got bool
	if err := e.raw.QueryRow("SELECT pg_try_advisory_lock($1)", k).Scan(&got); err != nil || got {
		t.Fatalf("a direct session took the held key: %v, %v", got, err)
	}
	var ok bool
	if err := db.QueryRow("SELECT pg_advisory_unlock($1)", k).Scan(&ok); err != nil || !ok {
		t.Fatalf("unlock through the pool: %v, %v", ok, err)
	}
	e.waitNoAdvisoryLocks(t)
	// A statement the holder cannot run apart from other work is refused.
	if _, err := db.Exec("SELECT pg_advisory_lock(id) FROM (VALUES (1)) v(id)"); err == nil || !strings.Contains(err.Error(), "cannot be split") {
		t.Fatalf("a mixed statement through the pooler: %v", err)
	}
	// The application's own statements keep their autocommit meaning.
	l, err := AcquireAdvisoryLock(context.Background(), db, 7)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, l.Conn(), "CREATE TABLE seen (id int)")
	mustExec(t, l.Conn(), "INSERT INTO seen VALUES (1)")
	var n int
	if err := e.raw.QueryRow("SELECT count(*) FROM seen").Scan(&n); err != nil || n != 1 {
		t.Fatalf("a committed write under the lock is not visible to others: %d, %v", n, err)
	}
	mustExec(t, l.Conn(), "CREATE INDEX CONCURRENTLY seen_id ON seen (id)")
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Mutual exclusion through the pooler: workers of three replicas (each its
// own *sql.DB) increment a counter under AcquireAdvisoryLock with a read
// and a write in separate statements; no increment is lost.
func TestPoolerMutualExclusion(t *testing.T) { pgtest.EachPooler(t, testPoolerMutualExclusion) }

func testPoolerMutualExclusion(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	mustExec(t, e.raw, "CREATE TABLE counter (n int)")
	mustExec(t, e.raw, "INSERT INTO counter VALUES (0)")
	const replicas, workers, rounds = 3, 2, 8
	ctx := context.Background()
	var wg sync.WaitGroup
	for range replicas {
		db := e.open(t, WithTransactionPooler())
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := AcquireAdvisoryLock(ctx, db, LockID("counter"))
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
			}()
		}
	}
	wg.Wait()
	var n int
	if err := e.raw.QueryRow("SELECT n FROM counter").Scan(&n); err != nil || n != replicas*workers*rounds {
		t.Fatalf("counter = %d (%v), want %d: increments were lost", n, err, replicas*workers*rounds)
	}
}

// Without WithTransactionPooler, a session lock through the pooler is not
// silent: the error names the pooler and the option.
func TestUndeclaredPoolerIsReported(t *testing.T) {
	pgtest.EachPooler(t, testUndeclaredPoolerIsReported)
}

func testUndeclaredPoolerIsReported(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	db := e.open(t)
	ctx := context.Background()
	c, err := db.Conn(ctx) // opened on server connection S1
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Another client takes S1 for a transaction, so the pooler gives c's
	// next statement another server connection (PgBouncer reuses the most
	// recently released server first).
	other, err := sql.Open("pgx", e.pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var one int
	if err := tx.QueryRow("SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	_, err = c.ExecContext(ctx, "SELECT pg_advisory_lock(11)")
	if !errors.Is(err, ErrTransactionPooler) || !strings.Contains(err.Error(), "WithTransactionPooler") || !strings.Contains(err.Error(), "PgBouncer") {
		t.Fatalf("a session lock through an undeclared pooler: %v", err)
	}
	tx.Rollback()
	// The lock was left on a server connection of the pooler's: release it
	// for the test's own invariant.
	mustExec(t, e.raw, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = 11")
}

// A holder whose transaction the server kills (idle_in_transaction_
// session_timeout) is a lost lock, reported like any other.
func TestPoolerHolderKilledByIdleTimeoutIsLost(t *testing.T) {
	pgtest.EachPooler(t, testPoolerHolderKilledByIdleTimeoutIsLost)
}

func testPoolerHolderKilledByIdleTimeoutIsLost(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	var db string
	if err := e.raw.QueryRow("SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	mustExec(t, e.raw, "ALTER DATABASE "+db+" SET idle_in_transaction_session_timeout = '300ms'")
	wrapped := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	l, err := AcquireAdvisoryLock(ctx, wrapped, 12)
	if err != nil {
		t.Fatal(err)
	}
	holder := l.c.pin.Hold.PID()
	if holder == 0 {
		t.Fatal("no holder connection")
	}
	waitFor(t, 20*time.Second, "the server to end the idle holder", func() bool { return !backendAlive(t, e.raw, holder) })
	gone := time.Now()
	select {
	case <-l.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("the killed holder was not reported lost")
	}
	// Within one check interval (50 ms here), give or take the loaded CI
	// machine's scheduling: a bound of ten intervals.
	if d := time.Since(gone); d > 10*50*time.Millisecond {
		t.Errorf("the loss was reported %v after the holder's backend ended", d)
	}
	if !errors.Is(l.Err(), ErrLockLost) || !strings.Contains(e.log.String(), "advisory lock lost") {
		t.Fatalf("Err() = %v; log:\n%s", l.Err(), e.log)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release of the lost lock: %v", err)
	}
}

// Transaction-level locks need no holder: Lock works through the pooler as
// it is, with or without the option.
func TestPoolerTransactionLevelLocks(t *testing.T) {
	pgtest.EachPooler(t, testPoolerTransactionLevelLocks)
}

func testPoolerTransactionLevelLocks(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	for _, opts := range [][]Option{nil, {WithTransactionPooler()}} {
		db := e.open(t, opts...)
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := Lock(ctx, tx, "jobs", 1); err != nil {
			t.Fatal(err)
		}
		tx2, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := TryLock(ctx, tx2, "jobs", 1); err != nil || ok {
			t.Fatalf("TryLock of a key another transaction holds: %v, %v", ok, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if ok, err := TryLock(ctx, tx2, "jobs", 1); err != nil || !ok {
			t.Fatalf("TryLock after the holder committed: %v, %v", ok, err)
		}
		tx2.Rollback()
	}
}

// BenchmarkTransactionPooler: statements through PgBouncer in transaction
// mode when no lock is held, raw pgx against lockhooks without and with
// WithTransactionPooler (the option must cost nothing then), through each
// PgBouncer of the test matrix (1.18 in exec mode, 1.25 with pgx's
// statement cache).
func BenchmarkTransactionPooler(b *testing.B) {
	for _, v := range pgtest.Versions {
		b.Run(v.String(), func(b *testing.B) {
			dsn := pgtest.SharedPoolerOf(b, v).DSN(b)
			benchSelectOne(b, []openedAs{
				{"driver=raw", func() (*sql.DB, error) { return sql.Open("pgx", dsn) }},
				{"driver=lockhooks/pooler=undeclared", func() (*sql.DB, error) { return Open("pgx", dsn) }},
				{"driver=lockhooks/pooler=declared", func() (*sql.DB, error) { return Open("pgx", dsn, WithTransactionPooler()) }},
			})
		})
	}
}

// BenchmarkPoolerProtectedStatement: a statement of the work an advisory
// lock protects, through PgBouncer in transaction mode: raw pgx (no lock)
// against lockhooks with WithTransactionPooler holding the lock, where each
// such statement first pings the holder (one round trip), so that none
// runs once the holder is gone (issue 21, point 2).
func BenchmarkPoolerProtectedStatement(b *testing.B) {
	dsn := pgtest.PoolerDSN(b)
	ctx := context.Background()
	b.Run("driver=raw", func(b *testing.B) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		c, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		for b.Loop() {
			if _, err := c.ExecContext(ctx, "SELECT 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("driver=lockhooks/holding", func(b *testing.B) {
		db, err := Open("pgx", dsn, WithTransactionPooler())
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		l, err := AcquireAdvisoryLock(ctx, db, 4242)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Release(ctx)
		for b.Loop() {
			if _, err := l.Conn().ExecContext(ctx, "SELECT 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Through a declared transaction pooler the holder learns its backend pid
// in the round trip that begins its transaction: that pid is the backend
// pg_locks shows holding the lock, inside the open transaction that keeps
// the server connection, for a first hold and for a hold after the holder's
// transaction ended with the last release.
func TestPoolerHolderBackend(t *testing.T) { pgtest.EachPooler(t, testPoolerHolderBackend) }

func testPoolerHolderBackend(t *testing.T, p *pgtest.Pooler) {
	e := newPoolerEnv(t, p)
	wrapped := e.open(t, WithTransactionPooler())
	ctx := context.Background()
	for range 2 {
		l, err := AcquireAdvisoryLock(ctx, wrapped, 13)
		if err != nil {
			t.Fatal(err)
		}
		got, want := l.c.pin.Hold.PID(), holderPID(t, e.raw, 13)
		var state string
		if err := e.raw.QueryRow("SELECT state FROM pg_stat_activity WHERE pid = $1", want).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if got != want || state != "idle in transaction" {
			t.Errorf("holder pid %d, pg_locks shows the lock on %d (%s)", got, want, state)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
