package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgstmt"
)

// skipWithoutGoroutineIdentity skips, loudly, where lockhooks recognises
// no self-wait.
func skipWithoutGoroutineIdentity(t *testing.T) {
	t.Helper()
	if callsite.CurrentGoroutine() == 0 {
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
		return w.core.Waiting() == 2
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

// SQLite's in-process locks: a second transaction inside RunInTx's fn
// that Locks an id fn's transaction holds fails at once. A second
// AcquireAdvisoryLock of a key the same goroutine holds is not one for
// certain (the first lock may have been handed to a worker that releases
// it): it waits, and its timeout error says it is likely a self-wait, as
// does its slow-wait log line.
func TestSelfWaitSQLiteLocks(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	log := &syncBuffer{}
	db := openSQLite(t, WithSlowLockLog(50*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(log, nil))))
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

	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	held, err := AcquireAdvisoryLock(short, db, 99)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	_, err = AcquireAdvisoryLock(short, db, 99)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrSelfWait) {
		t.Fatalf("a second AcquireAdvisoryLock on the same goroutine: %v, want it to wait until its context ends", err)
	}
	for _, want := range []string{"selfwait_test.go:", "likely a self-wait"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the timeout error lacks %q: %v", want, err)
		}
	}
	waitFor(t, 20*time.Second, "the slow-wait log's still-waiting line", func() bool {
		return strings.Contains(log.String(), "still waiting")
	})
	if !strings.Contains(log.String(), `self_wait="held by a lock this goroutine took with this context: likely a self-wait`) {
		t.Errorf("the slow-wait log does not say it is likely a self-wait:\n%s", log.String())
	}
}

// An AdvisoryLock handed to a worker goroutine that releases it when its
// batch is done: the loop that acquired it acquires the key again for the
// next batch, with the same context, and waits for the worker.
func TestSelfWaitNotForAdvisoryLockHandedToWorker(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			var db *sql.DB
			if dialect == "sqlite" {
				db = openSQLite(t)
			} else {
				db = openPG(t, WithSlowLockLog(0))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			released := make(chan error, 3)
			for batch := range 3 {
				l, err := AcquireAdvisoryLock(ctx, db, 77)
				if err != nil {
					t.Fatalf("batch %d: %v", batch, err)
				}
				go func() { // the worker releases the lock when its batch is done
					time.Sleep(50 * time.Millisecond)
					released <- l.Release(context.Background())
				}()
			}
			for range 3 {
				if err := <-released; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// The same goroutine hands its transaction (begun with db.BeginTx) to a
// committer and then writes with the same context: the committer ends
// the transaction, so the wait ends.
func TestSelfWaitNotForTxHandedToCommitter(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db, _ := openSQLiteFile(t, WithBusyTimeout(10*time.Second))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { // the committer
		time.Sleep(50 * time.Millisecond)
		committed <- tx.Commit()
	}()
	if _, err = db.ExecContext(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("a write that the committer's COMMIT lets through: %v", err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
}

// A transaction begun on a goroutine that then exits (handing the *sql.Tx
// to its caller) must not pass for the transaction of a later goroutine
// that the runtime gives the exited one's descriptor (callsite.CurrentGoroutine), with the
// same context (context.Background() values all compare equal): that
// writer waits for the caller's COMMIT. Repeated until the descriptor was
// reused a few times (most rounds at GOMAXPROCS 1); the test passes
// whether or not it was.
func TestSelfWaitNotAfterGoroutineReuse(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	db, _ := openSQLiteFile(t, WithBusyTimeout(10*time.Second))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT)")
	reused := 0
	for round := 0; round < 50 && reused < 3; round++ {
		type begun struct {
			tx *sql.Tx
			g  uintptr
		}
		txs := make(chan begun)
		go func() {
			tx, err := db.Begin() // context.Background()
			if err != nil {
				panic(err)
			}
			txs <- begun{tx, callsite.CurrentGoroutine()}
		}()
		a := <-txs
		time.Sleep(time.Millisecond) // goroutine A has most likely exited
		type wrote struct {
			err error
			g   uintptr
		}
		done := make(chan wrote, 1)
		go func() {
			_, err := db.Exec("INSERT INTO t DEFAULT VALUES") // waits for a.tx, which the test commits
			done <- wrote{err, callsite.CurrentGoroutine()}
		}()
		time.Sleep(20 * time.Millisecond)
		if _, err := a.tx.Exec("INSERT INTO t DEFAULT VALUES"); err != nil {
			t.Fatal(err)
		}
		if err := a.tx.Commit(); err != nil {
			t.Fatal(err)
		}
		b := <-done
		if a.g == b.g {
			reused++
		}
		if b.err != nil {
			t.Fatalf("round %d: goroutine B (g %#x; the transaction's goroutine A, exited, was %#x): %v", round, b.g, a.g, b.err)
		}
	}
	t.Logf("descriptor reused in %d rounds", reused)
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

	// An advisory key fn's transaction holds, asked for on the *sql.DB
	// with another context.
	err = RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(42)"); err != nil {
			return err
		}
		other, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := db.ExecContext(other, "SELECT pg_advisory_lock(42)")
		return err
	})
	wantSelfWait(t, err, "advisory key 42")
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
	time.Sleep(3 * pgstmt.SelfWaitProbeDelay) // let a (wrong) probe fire; the outcome does not depend on it
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
	events, _ := connectorOf(t, db).Events.Snapshot()
	n := 0
	for _, e := range events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// Postgres: a transaction begun with db.BeginTx and handed to a committer
// goroutine; the goroutine that began it then locks the row FOR UPDATE
// with the same context, and gets it once the committer commits. Without
// a committer the same wait is likely a self-wait: it waits until its
// context ends, and the error says so.
func TestSelfWaitNotForPostgresRowHandedOff(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db := openPG(t, WithSlowLockLog(0))
	mustExec(t, db, "CREATE TABLE jobs (id int PRIMARY KEY, state text)")
	mustExec(t, db, "INSERT INTO jobs VALUES (1, 'new')")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE jobs SET state = 'running' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		time.Sleep(10 * pgstmt.SelfWaitProbeDelay) // long after a probe would have cancelled the wait
		committed <- tx.Commit()
	}()
	var state string
	if err := db.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(&state); err != nil {
		t.Fatalf("FOR UPDATE of a row another goroutine commits: %v", err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if state != "running" {
		t.Errorf("state %q, want the committed 'running'", state)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	mustExec(t, tx, "UPDATE jobs SET state = 'again' WHERE id = 1")
	// The wait, with the transaction's context, ends by its lock_timeout.
	waiter, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	if _, err := waiter.ExecContext(ctx, "SET lock_timeout = '500ms'"); err != nil {
		t.Fatal(err)
	}
	err = waiter.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(&state)
	if err == nil || errors.Is(err, ErrSelfWait) || !strings.Contains(err.Error(), "likely a self-wait") {
		t.Fatalf("FOR UPDATE of a row this goroutine's own open transaction updated: %v, want a timeout saying it is likely a self-wait", err)
	}
}

// Advisory locks belong to one database: the same key in two databases
// (two *sql.DB of the process) never conflicts, so a call chain that holds
// a key or lockset id in database A takes it in database B at once, even
// inside RunInTx's fn.
func TestSelfWaitNotAcrossDatabases(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	dbA, dbB := openPG(t), openPG(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := RunInTx(ctx, dbA, nil, func(txA *sql.Tx) error {
		if err := Lock(ctx, txA, "jobs", 7); err != nil {
			return err
		}
		if _, err := txA.ExecContext(ctx, "SELECT pg_advisory_xact_lock(42)"); err != nil {
			return err
		}
		txB, err := dbB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer txB.Rollback()
		if err := Lock(ctx, txB, "jobs", 7); err != nil {
			return fmt.Errorf("Lock of the same id in another database: %w", err)
		}
		if _, err := txB.ExecContext(ctx, "SELECT pg_advisory_xact_lock(42)"); err != nil {
			return fmt.Errorf("pg_advisory_xact_lock(42) in database B while database A holds 42: %w", err)
		}
		if _, err := dbB.ExecContext(ctx, "SELECT pg_advisory_lock(43), pg_advisory_unlock(43)"); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Through a pooler (declared here), the backend a connection met at
// connect may serve another client: the probe that cancels a row-lock
// self-wait on the server never runs there. The same certain self-wait
// as in TestSelfWaitPostgres waits until its lock_timeout, and its error
// says it is likely a self-wait.
func TestSelfWaitProbeNotThroughAPooler(t *testing.T) {
	skipWithoutGoroutineIdentity(t)
	db := openPG(t, WithSlowLockLog(0), WithTransactionPooler())
	mustExec(t, db, "CREATE TABLE jobs (id int PRIMARY KEY, state text)")
	mustExec(t, db, "INSERT INTO jobs VALUES (1, 'new')")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE jobs SET state = 'running' WHERE id = 1"); err != nil {
			return err
		}
		waiter, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer waiter.Close()
		if _, err := waiter.ExecContext(ctx, "SET lock_timeout = '500ms'"); err != nil {
			return err
		}
		return waiter.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(string))
	})
	if err == nil || errors.Is(err, ErrSelfWait) || dberr.SQLState(err) != "55P03" || !strings.Contains(err.Error(), "likely a self-wait") {
		t.Fatalf("a self-wait through a declared pooler: %v; want its lock_timeout, said to be likely a self-wait", err)
	}
	if n := eventsOf(t, db, eventSelfWait); n != 0 {
		t.Errorf("%d self-wait events: the probe ran", n)
	}
}
