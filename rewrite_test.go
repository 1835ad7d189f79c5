package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgtest"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// fkSchema is a parent table and a child table referencing it.
const fkSchema = `
CREATE TABLE parent (id int PRIMARY KEY, counter int NOT NULL DEFAULT 0);
CREATE TABLE child (id serial PRIMARY KEY, parent_id int NOT NULL REFERENCES parent (id));
INSERT INTO parent (id) VALUES (1), (2);`

// openPGPair opens one fresh database twice: through lockhooks (with opts)
// and through the raw pgx driver.
func openPGPair(t *testing.T, opts ...Option) (wrapped, raw *sql.DB) {
	t.Helper()
	dsn := pgtest.DSN(t)
	wrapped, err := Open("pgx", dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	raw, err = sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wrapped.Close(); raw.Close() })
	mustExec(t, raw, fkSchema)
	return wrapped, raw
}

// childInsertWaits reports whether inserting a child of parent 1 on a raw
// connection has to wait for the row lock tx holds: with a lock_timeout it
// fails with 55P03 if it had to wait longer than the timeout.
func childInsertWaits(t *testing.T, raw *sql.DB, timeout string) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	mustExec(t, tx, "SET LOCAL lock_timeout = '"+timeout+"'")
	_, err = tx.ExecContext(ctx, "INSERT INTO child (parent_id) VALUES (1)")
	if err == nil {
		return false
	}
	if dberr.SQLState(err) != "55P03" {
		t.Fatalf("child insert: %v, want success or a lock timeout", err)
	}
	return true
}

// lockParent runs one of the ways a statement reaches the driver, locking
// parent 1 inside tx.
type lockParent func(ctx context.Context, tx *sql.Tx) error

var lockPaths = map[string]lockParent{
	"Exec": func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "SELECT id FROM parent WHERE id = 1 FOR UPDATE")
		return err
	},
	"Query": func(ctx context.Context, tx *sql.Tx) error {
		var id int
		return tx.QueryRowContext(ctx, "SELECT id FROM parent WHERE id = $1 FOR UPDATE", 1).Scan(&id)
	},
	"Prepare": func(ctx context.Context, tx *sql.Tx) error {
		s, err := tx.PrepareContext(ctx, "SELECT id FROM parent WHERE id = $1 FOR UPDATE")
		if err != nil {
			return err
		}
		defer s.Close()
		var id int
		return s.QueryRowContext(ctx, 1).Scan(&id)
	},
}

// Through the wrapper, a parent locked FOR UPDATE does not block inserting
// its children; through the raw driver it does.
func TestParentLockDoesNotBlockChildInserts(t *testing.T) {
	wrapped, raw := openPGPair(t)
	ctx := context.Background()
	for name, lock := range lockPaths {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				db        *sql.DB
				ctx       context.Context
				wantWaits bool
				why       string
			}{
				{wrapped, ctx, false, "lockhooks"},
				{raw, ctx, true, "raw pgx"},
				{wrapped, KeepForUpdate(ctx), true, "lockhooks with KeepForUpdate"},
			} {
				tx, err := c.db.BeginTx(c.ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := lock(c.ctx, tx); err != nil {
					t.Fatal(err)
				}
				timeout := "2s"
				if c.wantWaits {
					timeout = "100ms"
				}
				if got := childInsertWaits(t, raw, timeout); got != c.wantWaits {
					t.Errorf("%s: child insert waited = %v, want %v", c.why, got, c.wantWaits)
				}
				tx.Rollback()
			}
		})
	}
}

func TestRewriteOptOuts(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		opts      []Option
		query     string
		wantWaits bool
	}{
		{"default", nil, "SELECT id FROM parent WHERE id = 1 FOR UPDATE", false},
		{"keep comment", nil, "SELECT id FROM parent WHERE id = 1 FOR UPDATE " + KeepForUpdateComment, true},
		{"WithKeyShareRewrite(false)", []Option{WithKeyShareRewrite(false)}, "SELECT id FROM parent WHERE id = 1 FOR UPDATE", true},
		{"FOR UPDATE in a CTE", nil, "WITH p AS (SELECT id FROM parent WHERE id = 1 FOR UPDATE) SELECT * FROM p", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			wrapped, raw := openPGPair(t, c.opts...)
			tx, err := wrapped.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			mustExec(t, tx, c.query)
			timeout := "2s"
			if c.wantWaits {
				timeout = "100ms"
			}
			if got := childInsertWaits(t, raw, timeout); got != c.wantWaits {
				t.Errorf("child insert waited = %v, want %v", got, c.wantWaits)
			}
			// What the server ran is visible in pg_stat_activity.
			var pid int
			var text string
			if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			mustExec(t, tx, c.query)
			if err := raw.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&text); err != nil {
				t.Fatal(err)
			}
			if rewritten := strings.Contains(text, "NO KEY UPDATE"); rewritten == c.wantWaits {
				t.Errorf("the server ran %q", text)
			}
		})
	}
}

// The deadlock of PostgreSQL's fk-deadlock.spec: two transactions insert
// children of one parent (each takes FOR KEY SHARE on it), then both lock
// the parent FOR UPDATE. Raw, each waits for the other: 40P01. Through the
// wrapper FOR NO KEY UPDATE does not conflict with KEY SHARE: the first
// gets the lock, the second waits for it, no deadlock.
func TestForeignKeyDeadlockIsAvoided(t *testing.T) {
	for _, c := range []struct {
		name         string
		wrapped      bool
		wantDeadlock bool
	}{
		{"raw", false, true},
		{"lockhooks", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			wrapped, raw := openPGPair(t)
			setDatabaseDefault(t, "deadlock_timeout", "50ms", raw, wrapped)
			db := raw
			if c.wrapped {
				db = wrapped
			}
			db.SetMaxOpenConns(4)
			ctx := context.Background()
			a, b := beginWithPID(t, db), beginWithPID(t, db)
			defer a.tx.Rollback()
			defer b.tx.Rollback()
			mustExec(t, a.tx, "INSERT INTO child (parent_id) VALUES (1)")
			mustExec(t, b.tx, "INSERT INTO child (parent_id) VALUES (1)")

			lock := "SELECT id FROM parent WHERE id = 1 FOR UPDATE"
			errA := make(chan error, 1)
			go func() { _, err := a.tx.ExecContext(ctx, lock); errA <- err }()
			if c.wantDeadlock {
				waitFor(t, 10*time.Second, "A to wait for B's key-share lock", func() bool { return waiting(t, raw, a.pid) })
			} else if err := <-errA; err != nil {
				t.Fatalf("A's parent lock: %v", err)
			}
			errB := make(chan error, 1)
			go func() { _, err := b.tx.ExecContext(ctx, lock); errB <- err }()

			if c.wantDeadlock {
				e1, e2 := <-errA, <-errB
				deadlocks := 0
				for _, err := range []error{e1, e2} {
					if dberr.SQLState(err) == "40P01" {
						deadlocks++
					} else if err != nil {
						t.Fatalf("unexpected error: %v", err)
					}
				}
				if deadlocks != 1 {
					t.Fatalf("%d deadlocks, want 1", deadlocks)
				}
				return
			}
			waitFor(t, 10*time.Second, "B to wait for A's parent lock", func() bool { return waiting(t, raw, b.pid) })
			mustExec(t, a.tx, "UPDATE parent SET counter = counter + 1 WHERE id = 1")
			if err := a.tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-errB; err != nil {
				t.Fatalf("B's parent lock after A committed: %v", err)
			}
			if err := b.tx.Commit(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

type txWithPID struct {
	tx  *sql.Tx
	pid int
}

func beginWithPID(t *testing.T, db *sql.DB) txWithPID {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return txWithPID{tx, pid}
}

// waiting reports whether backend pid waits for a lock.
func waiting(t *testing.T, db *sql.DB, pid int) bool {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// setDatabaseDefault sets a parameter for new sessions of the test database
// and makes the pools open new sessions.
func setDatabaseDefault(t *testing.T, param, value string, dbs ...*sql.DB) {
	t.Helper()
	mustExec(t, dbs[0], "ALTER DATABASE "+currentDatabase(t, dbs[0])+" SET "+param+" = '"+value+"'")
	for _, db := range dbs {
		db.SetMaxIdleConns(0) // closes the idle sessions that have the old value
		db.SetMaxIdleConns(2)
	}
}

func currentDatabase(t testing.TB, db *sql.DB) string {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// fkWorkload runs workers transactions that each insert a child of a parent
// and then lock and update that parent — the pattern that deadlocks with
// FOR UPDATE. It returns how many transactions committed and how many
// failed with 40P01.
func fkWorkload(t *testing.T, db *sql.DB, workers, perWorker int) (committed, deadlocks int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				parent := 1 + (w+i)%2
				err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if _, err := tx.ExecContext(ctx, "INSERT INTO child (parent_id) VALUES ($1)", parent); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, "SELECT id FROM parent WHERE id = $1 FOR UPDATE", parent); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, "UPDATE parent SET counter = counter + 1 WHERE id = $1", parent); err != nil {
						return err
					}
					return tx.Commit()
				}()
				mu.Lock()
				switch {
				case err == nil:
					committed++
				case dberr.SQLState(err) == "40P01":
					deadlocks++
				default:
					t.Errorf("worker %d: %v", w, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return committed, deadlocks
}

// The workload deadlocks on the raw driver and never through the wrapper;
// the parent counters match the committed transactions (no lost update).
func TestForeignKeyWorkloadHasNoDeadlocks(t *testing.T) {
	const workers, perWorker = 4, 40
	wrapped, raw := openPGPair(t)
	setDatabaseDefault(t, "deadlock_timeout", "20ms", raw, wrapped)
	for _, db := range []*sql.DB{wrapped, raw} {
		db.SetMaxOpenConns(workers)
	}

	start := time.Now()
	committed, deadlocks := fkWorkload(t, wrapped, workers, perWorker)
	wrappedTime := time.Since(start)
	if deadlocks != 0 || committed != workers*perWorker {
		t.Errorf("lockhooks: %d committed, %d deadlocks; want %d and 0", committed, deadlocks, workers*perWorker)
	}
	var total, children int
	if err := raw.QueryRow("SELECT (SELECT sum(counter) FROM parent), (SELECT count(*) FROM child)").Scan(&total, &children); err != nil {
		t.Fatal(err)
	}
	if total != committed || children != committed {
		t.Errorf("parent counters sum to %d and %d children exist; want %d each", total, children, committed)
	}

	// The raw driver's deadlocks depend on how the workers interleave: on a
	// loaded machine one round may have none, so it runs up to five.
	const rounds = 5
	var rawCommitted, rawDeadlocks, round int
	start = time.Now()
	for round = 1; round <= rounds && rawDeadlocks == 0; round++ {
		c, d := fkWorkload(t, raw, workers, perWorker)
		rawCommitted, rawDeadlocks = rawCommitted+c, rawDeadlocks+d
	}
	t.Logf("raw pgx: %d committed, %d deadlocks in %d rounds, %v; lockhooks: %d committed, %d deadlocks in one round, %v",
		rawCommitted, rawDeadlocks, round-1, time.Since(start).Round(time.Millisecond), committed, deadlocks, wrappedTime.Round(time.Millisecond))
	if rawDeadlocks == 0 {
		t.Errorf("the raw driver had no deadlock in %d rounds: the workload does not show what it should", rounds)
	}
}

// Postgres refuses FOR UPDATE over an outer join; the wrapper's error keeps
// the driver's error and names the fix.
func TestOuterJoinLockErrorNamesTheFix(t *testing.T) {
	wrapped, _ := openPGPair(t)
	q := "SELECT p.id FROM parent p LEFT JOIN child c ON c.parent_id = p.id WHERE p.id = 1 FOR UPDATE"
	_, err := wrapped.Exec(q)
	var oj *OuterJoinLockError
	if !errors.As(err, &oj) {
		t.Fatalf("error %v (%T), want an *OuterJoinLockError", err, err)
	}
	if dberr.SQLState(err) != "0A000" {
		t.Errorf("the driver's error is not reachable with errors.As: %v", err)
	}
	if oj.Fix != "FOR NO KEY UPDATE OF p" || !strings.Contains(err.Error(), "FOR NO KEY UPDATE OF p") {
		t.Errorf("fix %q in %q", oj.Fix, err)
	}
	// The suggested clause works.
	if _, err := wrapped.Exec(strings.Replace(q, "FOR UPDATE", "FOR UPDATE OF p", 1)); err != nil {
		t.Errorf("the suggested fix failed: %v", err)
	}
}

// One SQL text serves both dialects: SQLite has no locking clauses, and the
// wrapper removes them.
func TestSQLiteAcceptsLockingClauses(t *testing.T) {
	wrapped := openSQLite(t)
	mustExec(t, wrapped, "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
	mustExec(t, wrapped, "INSERT INTO t VALUES (1, 10)")
	for _, q := range []string{
		"SELECT v FROM t WHERE id = ? FOR UPDATE",
		"SELECT v FROM t WHERE id = ? FOR NO KEY UPDATE OF t SKIP LOCKED",
		"SELECT v FROM t WHERE id = ? FOR SHARE NOWAIT",
		"SELECT v FROM t WHERE id = ? FOR KEY SHARE",
	} {
		var v int
		if err := wrapped.QueryRow(q, 1).Scan(&v); err != nil || v != 10 {
			t.Errorf("%s: %d, %v", q, v, err)
		}
		s, err := wrapped.Prepare(q)
		if err != nil {
			t.Errorf("prepare %s: %v", q, err)
			continue
		}
		if err := s.QueryRow(1).Scan(&v); err != nil {
			t.Errorf("prepared %s: %v", q, err)
		}
		s.Close()
	}

	raw, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec("SELECT 1 FOR UPDATE"); err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Errorf("raw modernc accepted FOR UPDATE: %v", err)
	}
}

// Statements without a locking clause and repeated statements with one cost
// no allocation in the hooks.
func TestInterceptAllocations(t *testing.T) {
	for _, d := range []Dialect{Postgres, SQLite} {
		c := &conn{connector: newConnector(nil, nil, mustOptions(t, WithDialect(d)), "", sqlitelock.DSN{})}
		ctx := context.Background()
		for _, q := range []string{
			"UPDATE t SET v = v + 1 WHERE id = $1",
			"SELECT v FROM t WHERE id = $1 FOR UPDATE",
			"SELECT foreign_id FROM t",
		} {
			c.intercept(ctx, q) // fill the cache
			if n := testing.AllocsPerRun(100, func() { c.intercept(ctx, q) }); n != 0 {
				t.Errorf("%s: intercept(%q) allocated %v times", d, q, n)
			}
			// The writer-lock decision: the cached fact, or IsWrite on
			// the no-clause path.
			if n := testing.AllocsPerRun(100, func() { c.intercept(ctx, q).writes() }); n != 0 {
				t.Errorf("%s: writes of %q allocated %v times", d, q, n)
			}
		}
	}
}

func mustOptions(t testing.TB, opts ...Option) *options {
	t.Helper()
	o, err := resolveOptions(opts)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
