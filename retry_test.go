package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// setupAccounts creates accounts(id, balance) with two rows of 100 and a
// transfers log.
func setupAccounts(t *testing.T, db *sql.DB) {
	t.Helper()
	mustExec(t, db, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
	mustExec(t, db, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100)")
	mustExec(t, db, "CREATE TABLE transfers (id SERIAL PRIMARY KEY, src INTEGER NOT NULL, dst INTEGER NOT NULL)")
}

// TestRunInTxRetriesRealDeadlocks makes two goroutines lock the same two
// rows in opposite orders, lined up with channels so that every round is
// a real deadlock; Postgres aborts one of them (40P01) and RunInTx runs
// it again. Every transfer lands exactly once.
func TestRunInTxRetriesRealDeadlocks(t *testing.T) {
	db := openPG(t)
	setupAccounts(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const rounds = 3
	var retries atomic.Int32
	var victimErr atomic.Value
	var mu sync.Mutex
	var retryLog []string
	onRetry := OnRetry(func(e RetryEvent) {
		retries.Add(1)
		victimErr.Store(e.Err)
		mu.Lock()
		retryLog = append(retryLog, fmt.Sprintf("attempt %d: %v", e.Attempt, e.Err))
		mu.Unlock()
	})
	transfer := func(src, dst int, mine chan<- struct{}, theirs <-chan struct{}) error {
		first := true
		return RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "SET LOCAL deadlock_timeout = '20ms'"); err != nil {
				return err
			}
			var bal int
			if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE", src).Scan(&bal); err != nil {
				return err
			}
			if first {
				first = false
				close(mine) // I hold src
				select {
				case <-theirs: // they hold dst: the next statement closes the cycle
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = $1", dst); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - 10 WHERE id = $1", src); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO transfers (src, dst) VALUES ($1, $2)", src, dst)
			return err
		}, onRetry, Backoff(time.Millisecond, 10*time.Millisecond))
	}
	for round := range rounds {
		a, b := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Add(2)
		go func() { defer wg.Done(); errs[0] = transfer(1, 2, a, b) }()
		go func() { defer wg.Done(); errs[1] = transfer(2, 1, b, a) }()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, transfer %d: %v", round, i, err)
			}
		}
		// At least one victim per round. There can be more: the victim's
		// retry can take row 2 before the woken winner re-locks it (a row
		// lock wait is a wait for the holder's transaction, and after it
		// ends nobody has priority), and the two deadlock again.
		if got := retries.Load(); got < int32(round+1) {
			t.Fatalf("after round %d: %d retries, want at least one deadlock victim per round", round, got)
		}
	}
	mu.Lock()
	for _, r := range retryLog {
		if !strings.Contains(r, "SQLSTATE 40P01") {
			t.Errorf("a retry for something other than a deadlock: %s", r)
		}
	}
	mu.Unlock()
	var sum, n1, n2, logged int
	if err := db.QueryRow("SELECT sum(balance), min(balance), max(balance) FROM accounts").Scan(&sum, &n1, &n2); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT count(*) FROM transfers").Scan(&logged); err != nil {
		t.Fatal(err)
	}
	if sum != 200 || n1 != 100 || n2 != 100 || logged != 2*rounds {
		t.Errorf("balances sum %d (min %d, max %d), %d transfers logged; want 200, both 100, %d", sum, n1, n2, logged, 2*rounds)
	}
	err, _ := victimErr.Load().(error)
	if !IsDeadlock(err) || !IsRetryable(err) {
		t.Fatalf("the victim's error is not classified as a deadlock: %v", err)
	}
	var de *DeadlockError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "rows of accounts (FOR NO KEY UPDATE)") {
		t.Errorf("the deadlock error does not name the row lock the transaction held: %v", err)
	}
	t.Logf("%d retries in %d rounds; the last victim's error: %v", retries.Load(), rounds, err)
}

// TestRunInTxRetriesRepeatableReadConflict: the first attempt reads a row,
// another transaction commits a change to it, the update then fails with
// 40001; the second attempt has a new snapshot and succeeds.
func TestRunInTxRetriesRepeatableReadConflict(t *testing.T) {
	db := openPG(t)
	setupAccounts(t, db)
	ctx := context.Background()
	attempts := 0
	var retried []error
	err := RunInTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, func(tx *sql.Tx) error {
		attempts++
		var bal int
		if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&bal); err != nil {
			return err
		}
		if attempts == 1 { // another transaction commits after our snapshot
			if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 1"); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = 1", bal*2)
		return err
	}, OnRetry(func(e RetryEvent) { retried = append(retried, e.Err) }))
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || len(retried) != 1 || !IsSerializationFailure(retried[0]) {
		t.Fatalf("%d attempts, retried for %v; want 2 attempts after one serialization failure", attempts, retried)
	}
	var bal int
	if err := db.QueryRow("SELECT balance FROM accounts WHERE id = 1").Scan(&bal); err != nil {
		t.Fatal(err)
	}
	if bal != 202 {
		t.Errorf("balance %d, want 202: the retry must see the concurrent +1", bal)
	}
}

// openRawSQLite opens path through modernc directly, in WAL mode, as
// another process would.
func openRawSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestRunInTxSQLiteDeferredReadThenWrite: the deferred read-then-write
// pattern. On a plain modernc database a write committed after the
// transaction's first read makes its write fail with SQLITE_BUSY_SNAPSHOT,
// which no busy timeout cures; RunInTx runs it again on a fresh snapshot.
// Through lockhooks the same code succeeds at the first attempt (the write
// transaction begins IMMEDIATE under the writer lock).
func TestRunInTxSQLiteDeferredReadThenWrite(t *testing.T) {
	ctx := context.Background()
	readThenWrite := func(db *sql.DB, interfere func() error) (attempts int, retried []error, err error) {
		err = RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			attempts++
			var bal int
			if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&bal); err != nil {
				return err
			}
			if attempts == 1 && interfere != nil {
				if err := interfere(); err != nil {
					return fmt.Errorf("the concurrent write: %w", err)
				}
			}
			_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE id = 1", bal+10)
			return err
		}, OnRetry(func(e RetryEvent) { retried = append(retried, e.Err) }))
		return attempts, retried, err
	}
	path := filepath.Join(t.TempDir(), "bank.db")
	raw := openRawSQLite(t, path)
	mustExec(t, raw, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
	mustExec(t, raw, "INSERT INTO accounts VALUES (1, 100)")

	t.Run("raw", func(t *testing.T) {
		attempts, retried, err := readThenWrite(raw, func() error {
			_, err := raw.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 1")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if attempts != 2 || len(retried) != 1 || !IsSerializationFailure(retried[0]) || !IsRetryable(retried[0]) {
			t.Fatalf("%d attempts, retried for %v; want 2 after one SQLITE_BUSY_SNAPSHOT", attempts, retried)
		}
		var bal int
		if err := raw.QueryRow("SELECT balance FROM accounts WHERE id = 1").Scan(&bal); err != nil || bal != 111 {
			t.Fatalf("balance %d (%v), want 111", bal, err)
		}
	})
	t.Run("lockhooks", func(t *testing.T) {
		db, err := Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		attempts, retried, err := readThenWrite(db, nil)
		if err != nil || attempts != 1 || len(retried) != 0 {
			t.Fatalf("%d attempts, retried %v, err %v; want one attempt", attempts, retried, err)
		}
	})
}

// TestRunInTxStopsAtOnce: fn's own error ends RunInTx after one attempt,
// and the error says so and wraps it; a panic rolls back.
func TestRunInTxStopsAtOnce(t *testing.T) {
	db := openSQLite(t)
	mustExec(t, db, "CREATE TABLE t (v INTEGER)")
	ctx := context.Background()
	mine := errors.New("no such customer")
	attempts := 0
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		attempts++
		if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		return mine
	})
	var re *RetryError
	if !errors.Is(err, mine) || !errors.As(err, &re) || re.Attempts != 1 || attempts != 1 || !strings.Contains(err.Error(), "attempt 1") {
		t.Fatalf("err %v after %d attempts", err, attempts)
	}
	if n := countRows(t, db, "t"); n != 0 {
		t.Errorf("%d rows after a failed attempt, want 0", n)
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic of fn", p)
			}
		}()
		RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			tx.ExecContext(ctx, "INSERT INTO t VALUES (2)")
			panic("boom")
		})
	}()
	// The panicking attempt rolled back and freed the writer lock.
	if err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (3)")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, "t"); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// sqliteLockedError returns a real SQLITE_LOCKED from the transaction: a
// table dropped while a statement of the same connection still reads it.
func sqliteLockedError(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, "SELECT v FROM t")
	if err != nil {
		return err
	}
	defer rows.Close()
	rows.Next()
	_, err = tx.ExecContext(ctx, "DROP TABLE t")
	if err == nil {
		return errors.New("DROP TABLE under an open cursor succeeded; expected SQLITE_LOCKED")
	}
	return err
}

// TestRunInTxAttemptOwnsItsLocks: locks taken with Lock in a failed
// attempt are released before the next attempt, and RunInTx gives up
// after MaxAttempts, or when ctx ends between attempts, saying how many
// attempts ran.
func TestRunInTxAttemptOwnsItsLocks(t *testing.T) {
	db := openSQLite(t)
	mustExec(t, db, "CREATE TABLE t (v INTEGER)")
	mustExec(t, db, "INSERT INTO t VALUES (1), (2)")
	ctx := context.Background()
	freeBetween := 0
	attempts := 0
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		attempts++
		if err := Lock(ctx, tx, "acct", 1); err != nil {
			return err
		}
		return sqliteLockedError(ctx, tx)
	}, MaxAttempts(3), Backoff(0, 0), OnRetry(func(e RetryEvent) {
		// Between attempts another transaction can take the lock.
		other, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Error(err)
			return
		}
		defer other.Rollback()
		if ok, err := TryLock(ctx, other, "acct", 1); ok && err == nil {
			freeBetween++
		}
	}))
	var re *RetryError
	if !errors.As(err, &re) || !re.Exhausted || re.Attempts != 3 || attempts != 3 || !IsRetryable(err) || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("err %v (attempts %d)", err, attempts)
	}
	if freeBetween != 2 {
		t.Errorf("the lock was free in %d of 2 pauses between attempts", freeBetween)
	}

	cctx, cancel := context.WithCancel(ctx)
	err = RunInTx(cctx, db, nil, func(tx *sql.Tx) error { return sqliteLockedError(ctx, tx) },
		Backoff(time.Hour, time.Hour), OnRetry(func(RetryEvent) { cancel() }))
	if !errors.As(err, &re) || re.Attempts != 1 || !errors.Is(err, context.Canceled) || !IsRetryable(err) {
		t.Fatalf("cancelled during the backoff: %v", err)
	}
}

// TestRunInTxLockNotAvailableOnlyWhenAsked: a lock_timeout (55P03) ends
// RunInTx at once by default; with RetryLockNotAvailable it is retried,
// and succeeds once the holder is gone.
func TestRunInTxLockNotAvailableOnlyWhenAsked(t *testing.T) {
	db := openPG(t)
	setupAccounts(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, retry := range []bool{false, true} {
		holder := beginTx(t, db, nil)
		mustExec(t, holder, "SELECT balance FROM accounts WHERE id = 1 FOR UPDATE")
		attempts := 0
		options := []RetryOption{OnRetry(func(e RetryEvent) {
			if !IsLockNotAvailable(e.Err) {
				t.Errorf("retried for %v", e.Err)
			}
			holder.Rollback() // the holder goes away between attempts
		})}
		if retry {
			options = append(options, RetryLockNotAvailable())
		}
		err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			attempts++
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '20ms'"); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 1")
			return err
		}, options...)
		holder.Rollback()
		switch {
		case !retry && (!IsLockNotAvailable(err) || attempts != 1):
			t.Errorf("by default: err %v after %d attempts; want 55P03 after one", err, attempts)
		case retry && (err != nil || attempts != 2):
			t.Errorf("with RetryLockNotAvailable: err %v after %d attempts; want success after two", err, attempts)
		}
	}
}

// TestRunInTxContextEndsDuringAttempt: a context cancelled while fn runs
// ends RunInTx after that attempt, rolled back.
func TestRunInTxContextEndsDuringAttempt(t *testing.T) {
	db := openSQLite(t)
	mustExec(t, db, "CREATE TABLE t (v INTEGER)")
	ctx, cancel := context.WithCancel(context.Background())
	attempts := 0
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		attempts++
		if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			return err
		}
		cancel()
		_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (2)")
		return err
	})
	var re *RetryError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &re) || re.Attempts != 1 || attempts != 1 {
		t.Fatalf("err %v after %d attempts", err, attempts)
	}
	if n := countRows(t, db, "t"); n != 0 {
		t.Errorf("%d rows after a cancelled attempt", n)
	}
}

// TestRunInTxSwallowedError: fn ignores a failed statement and returns
// nil; Postgres has aborted the transaction, and RunInTx says so instead
// of committing or reporting an ambiguous commit.
func TestRunInTxSwallowedError(t *testing.T) {
	db := openPG(t)
	setupAccounts(t, db)
	ctx := context.Background()
	err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
		tx.ExecContext(ctx, "INSERT INTO accounts VALUES (1, 0)") // duplicate key, ignored
		tx.ExecContext(ctx, "UPDATE accounts SET balance = 0 WHERE id = 2")
		return nil
	})
	if err == nil || errors.Is(err, ErrAmbiguousCommit) || !strings.Contains(err.Error(), "fn returned nil") {
		t.Fatalf("err %v", err)
	}
	var bal int
	if err := db.QueryRow("SELECT balance FROM accounts WHERE id = 2").Scan(&bal); err != nil || bal != 100 {
		t.Fatalf("balance %d (%v), want 100", bal, err)
	}
}

// An SQLite writer that waits for the writer lock longer than the busy
// timeout fails once, with the timeout and the holder in the error: the
// busy timeout is the longest wait, RunInTx included. With
// RetryLockNotAvailable it tries again (the holder here is gone by then).
func TestRunInTxWriterLockTimeoutNotRetriedUnlessAsked(t *testing.T) {
	db := openSQLite(t, WithBusyTimeout(50*time.Millisecond))
	mustExec(t, db, "CREATE TABLE t (v INTEGER)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, retry := range []bool{false, true} {
		holder := beginTx(t, db, nil) // holds the writer lock
		mustExec(t, holder, "INSERT INTO t VALUES (0)")
		attempts, retries := 0, 0
		options := []RetryOption{Backoff(0, 0), OnRetry(func(e RetryEvent) {
			retries++
			if !errors.Is(e.Err, ErrWriterLockTimeout) {
				t.Errorf("retried for %v", e.Err)
			}
			holder.Rollback() // the holder goes away between attempts
		})}
		if retry {
			options = append(options, RetryLockNotAvailable())
		}
		err := RunInTx(ctx, db, nil, func(tx *sql.Tx) error {
			attempts++
			_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
			return err
		}, options...)
		holder.Rollback()
		var re *RetryError
		switch {
		case !retry && (!errors.Is(err, ErrWriterLockTimeout) || !errors.As(err, &re) || re.Attempts != 1 || retries != 0 || attempts > 1 ||
			!strings.Contains(err.Error(), "waited 50ms") || !strings.Contains(err.Error(), "held by connection")):
			t.Errorf("by default: %v after %d attempts (%d retries); want ErrWriterLockTimeout after one, naming the wait and the holder", err, attempts, retries)
		case retry && (err != nil || retries != 1):
			t.Errorf("with RetryLockNotAvailable: %v after %d retries; want success after one", err, retries)
		}
	}
}
