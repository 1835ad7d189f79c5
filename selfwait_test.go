package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// skipWithoutGoroutineIdentity skips, loudly, where lockhooks recognises
// no self-wait.
func skipWithoutGoroutineIdentity(t *testing.T) {
	t.Helper()
	if currentG() == 0 {
		t.Skipf("SKIP: no goroutine identity on %s: self-waits are not recognised there", runtime.GOARCH)
	}
}

// wantSelfWait fails t unless err is RunInTx's first and only attempt,
// failed with ErrSelfWait, naming what.
func wantSelfWait(t *testing.T, err error, what ...string) {
	t.Helper()
	var re *RetryError
	if !errors.Is(err, ErrSelfWait) || !errors.As(err, &re) || re.Attempts != 1 {
		t.Fatalf("got %v, want RunInTx's first attempt failed with ErrSelfWait", err)
	}
	for _, w := range what {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error lacks %q: %v", w, err)
		}
	}
	if IsRetryable(err) {
		t.Errorf("a self-wait is retryable: %v", err)
	}
}

// SQLite: db.ExecContext with the transaction's context inside RunInTx
// (instead of tx.ExecContext) would wait for the writer lock its own
// transaction holds: it fails at once, RunInTx does not retry it, and the
// error says where the transaction began. With a busy timeout of a minute
// and a test bounded by a 30s context, a wait would not end in time.
func TestSelfWaitSQLiteWriterLock(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db, _ := openSQLiteFile(t, WithBusyTimeout(time.Minute))
	mustExec(t, db, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT)")
	mustExec(t, db, "INSERT INTO jobs VALUES (1, 'new')")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE jobs SET state = 'running' WHERE id = 1"); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, "UPDATE jobs SET state = 'done' WHERE id = 1") // the mistake
		return err
	})
	wantSelfWait(t, err, "UPDATE jobs SET state = 'done'", "the SQLite writer lock", "tx.ExecContext")

	// BeginTx of a second write transaction in the same call chain.
	err = RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE jobs SET state = 'a' WHERE id = 1"); err != nil {
			return err
		}
		tx2, err := db.BeginTx(ctx, nil)
		if err == nil {
			tx2.Rollback()
		}
		return err
	})
	wantSelfWait(t, err, "BeginTx of a write transaction")

	// The writer lock is free again and the row unchanged by the failures.
	var state string
	if err := db.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1").Scan(&state); err != nil || state != "new" {
		t.Fatalf("state %q, %v", state, err)
	}
	if got := eventsOf(t, db, eventSelfWait); got != 2 {
		t.Errorf("%d self_wait events, want 2", got)
	}
}

// No false positive: another goroutine, with the holder's very context
// (an errgroup's, say) or another one, waits for the writer lock and
// writes once the transaction commits.
func TestSelfWaitNotOtherGoroutines(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db, _ := openSQLiteFile(t, WithBusyTimeout(time.Minute))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, cancelOther := context.WithCancel(ctx)
	defer cancelOther()
	done := make(chan error, 2)
	for i, c := range []context.Context{ctx, other} {
		go func() {
			_, err := db.ExecContext(c, "INSERT INTO t VALUES (?)", 10+i)
			done <- err
		}()
	}
	w := &connectorOf(t, db).writer
	waitFor(t, 20*time.Second, "two waiters for the writer lock", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.waiters) == 2
	})
	if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("a writer of another goroutine: %v", err)
		}
	}
	if n := countRows(t, db, "t"); n != 3 {
		t.Errorf("%d rows, want 3", n)
	}
}

// SQLite's in-process locks: a second transaction of the same call chain
// that Locks an id the first holds, and AcquireAdvisoryLock of a key the
// same call chain holds, fail at once.
func TestSelfWaitSQLiteLocks(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db := openSQLite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := RunInTx(ctx, db, readOnly, func(tx *sql.Tx) error {
		if err := Lock(ctx, tx, "orders", 7); err != nil {
			return err
		}
		tx2, err := db.BeginTx(ctx, readOnly)
		if err != nil {
			return err
		}
		defer tx2.Rollback()
		return Lock(ctx, tx2, "orders", 7)
	})
	wantSelfWait(t, err, `lockset id orders / 7`)

	held, err := AcquireAdvisoryLock(ctx, db, 99)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if _, err := AcquireAdvisoryLock(ctx, db, 99); !errors.Is(err, ErrSelfWait) || !strings.Contains(err.Error(), "selfwait_test.go:") {
		t.Fatalf("a second AcquireAdvisoryLock of the same call chain: %v, want ErrSelfWait naming where the first took it", err)
	}
}

// Postgres: a row the transaction updated, locked FOR UPDATE through the
// *sql.DB with the transaction's context: the server says the statement
// waits for the transaction; lockhooks cancels it and RunInTx returns
// ErrSelfWait without retrying. A Lock of an id the transaction holds,
// from a second transaction of the same call chain, fails before it is
// sent.
func TestSelfWaitPostgres(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db := openPG(t, WithSlowLockLog(0))
	mustExec(t, db, "CREATE TABLE jobs (id int PRIMARY KEY, state text)")
	mustExec(t, db, "INSERT INTO jobs VALUES (1, 'new')")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := nextLine(t)
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE jobs SET state = 'running' WHERE id = 1"); err != nil {
			return err
		}
		return db.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(string))
	})
	wantSelfWait(t, err, "a row lock", "selfwait_test.go:"+strings.Split(began, ":")[1])
	t.Log(time.Now().Format(time.StampMilli), err)

	err = RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if err := Lock(ctx, tx, "jobs", 1); err != nil {
			return err
		}
		tx2, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx2.Rollback()
		return Lock(ctx, tx2, "jobs", 1)
	})
	wantSelfWait(t, err, `Lock("jobs", 1)`, "lockset id jobs / 1")
	t.Log(time.Now().Format(time.StampMilli), err)
	noAdvisoryLocksLeft(t, db)

	// Another goroutine with the same context waits, and gets the row once
	// the transaction commits.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, tx, "UPDATE jobs SET state = 'x' WHERE id = 1")
	done := make(chan error, 1)
	go func() {
		done <- db.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(string))
	}()
	time.Sleep(3 * selfWaitProbeDelay) // let a (wrong) probe fire; the outcome does not depend on it
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("another goroutine's FOR UPDATE: %v", err)
	}
}

// eventsOf counts the database's events of kind.
func eventsOf(t *testing.T, db *sql.DB, kind string) int {
	t.Helper()
	events, _ := connectorOf(t, db).events.snapshot()
	n := 0
	for _, e := range events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}
