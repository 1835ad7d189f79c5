package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// noTelemetry is telemetry with the global (no-op) providers.
var noTelemetry = newReporting(&options{}, "test", nil)

// openSQLiteFile opens one SQLite file through lockhooks; raw opens the
// same file through modernc as it is.
func openSQLiteFile(t testing.TB, opts ...Option) (wrapped *sql.DB, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "bank.db")
	db, err := Open("sqlite", path+"?_pragma=synchronous(NORMAL)", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

func beginTx(t testing.TB, db *sql.DB, opts *sql.TxOptions) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

var readOnly = &sql.TxOptions{ReadOnly: true}

func TestLocksetBasics(t *testing.T) {
	db, _ := openSQLiteFile(t)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")

	t.Run("re-entrant, released after commit", func(t *testing.T) {
		tx := beginTx(t, db, readOnly)
		if err := Lock(ctx, tx, "acct", 1, 2); err != nil {
			t.Fatal(err)
		}
		if err := Lock(ctx, tx, "acct", 2, 1); err != nil {
			t.Fatalf("re-entrant Lock: %v", err)
		}
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		if ok, err := TryLock(ctx, other, "acct", 1); ok || err != nil {
			t.Fatalf("TryLock of a held id: %v, %v", ok, err)
		}
		if ok, err := TryLock(ctx, other, "other-namespace", 1); !ok || err != nil {
			t.Fatalf("TryLock in another namespace: %v, %v", ok, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if ok, err := TryLock(ctx, other, "acct", 1, 2); !ok || err != nil {
			t.Fatalf("TryLock after the holder committed: %v, %v", ok, err)
		}
	})
	t.Run("cancel mid-wait releases what the call took", func(t *testing.T) {
		holder := beginTx(t, db, readOnly)
		defer holder.Rollback()
		if err := Lock(ctx, holder, "acct", 20); err != nil {
			t.Fatal(err)
		}
		waiter := beginTx(t, db, readOnly)
		defer waiter.Rollback()
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := Lock(cctx, waiter, "acct", 10, 20); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock waiting on a held id: %v", err)
		}
		third := beginTx(t, db, readOnly)
		defer third.Rollback()
		if ok, _ := TryLock(ctx, third, "acct", 10); !ok {
			t.Fatal("id 10, taken by the cancelled call, is still held")
		}
	})
	t.Run("TryLock takes all or none", func(t *testing.T) {
		holder := beginTx(t, db, readOnly)
		defer holder.Rollback()
		if err := Lock(ctx, holder, "acct", 32); err != nil {
			t.Fatal(err)
		}
		tx := beginTx(t, db, readOnly)
		defer tx.Rollback()
		if ok, err := TryLock(ctx, tx, "acct", 31, 32, 33); ok || err != nil {
			t.Fatalf("TryLock with one id held: %v, %v", ok, err)
		}
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		if ok, _ := TryLock(ctx, other, "acct", 31, 33); !ok {
			t.Fatal("a failed TryLock kept some of its ids")
		}
	})
	t.Run("rollback and context end release", func(t *testing.T) {
		tctx, cancel := context.WithCancel(ctx)
		tx, err := db.BeginTx(tctx, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		if err := Lock(tctx, tx, "acct", 40); err != nil {
			t.Fatal(err)
		}
		cancel() // database/sql rolls the transaction back
		other := beginTx(t, db, readOnly)
		defer other.Rollback()
		waitFor(t, 5*time.Second, "the cancelled transaction's lock to be released", func() bool {
			ok, _ := TryLock(ctx, other, "acct", 40)
			return ok
		})
	})
	if n := db.Stats().InUse; n > 0 {
		t.Logf("%d connections in use", n)
	}
}

func TestLockNeedsALockhooksTransaction(t *testing.T) {
	ctx := context.Background()
	if err := Lock(ctx, nil, "x", 1); err == nil || !strings.Contains(err.Error(), "nil *sql.Tx") {
		t.Errorf("nil tx: %v", err)
	}
	raw, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "raw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tx := beginTx(t, raw, nil)
	defer tx.Rollback()
	if err := Lock(ctx, tx, "x", 1); err == nil || !strings.Contains(err.Error(), "opened through lockhooks") {
		t.Errorf("raw modernc transaction: %v", err)
	}
}

func TestLockAfterSnapshot(t *testing.T) {
	db, _ := openSQLiteFile(t)
	ctx := context.Background()
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ro := beginTx(t, db, readOnly)
	defer ro.Rollback()
	var n int
	if err := ro.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := Lock(ctx, ro, "t", 1); !errors.Is(err, ErrLockAfterSnapshot) {
		t.Errorf("Lock after a read in a read-only SQLite transaction: %v", err)
	}
	ro.Rollback()
	// A write transaction began IMMEDIATE under the writer lock: its
	// snapshot is current, so reading first is fine.
	w := beginTx(t, db, nil)
	defer w.Rollback()
	if err := w.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := Lock(ctx, w, "t", 1); err != nil {
		t.Errorf("Lock after a read in a write transaction: %v", err)
	}
}

// B waits in Lock for A, which commits a write; B must see it. A variant
// that releases before COMMIT (broken on purpose) must fail the same test.
func TestReleaseAfterCommitIsObserved(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("release before commit=%v", broken), func(t *testing.T) {
			var bRead chan int
			var opts []Option
			if broken {
				opts = append(opts, func(o *options) {
					o.testReleaseBeforeCommit = func() {
						select { // let B read before A commits
						case v := <-bRead:
							bRead <- v
						case <-time.After(5 * time.Second):
						}
					}
				})
			}
			db, _ := openSQLiteFile(t, opts...)
			mustExec(t, db, "CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO c VALUES (1, 0)")
			ctx := context.Background()
			stale := 0
			const iterations = 30
			for i := range iterations {
				bRead = make(chan int, 1)
				a := beginTx(t, db, nil)
				if err := Lock(ctx, a, "c", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Exec("UPDATE c SET v = v + 1 WHERE id = 1"); err != nil {
					t.Fatal(err)
				}
				bDone := make(chan error, 1)
				go func() {
					b, err := db.BeginTx(ctx, readOnly)
					if err != nil {
						bDone <- err
						return
					}
					defer b.Rollback()
					if err := Lock(ctx, b, "c", 1); err != nil {
						bDone <- err
						return
					}
					var v int
					if err := b.QueryRow("SELECT v FROM c WHERE id = 1").Scan(&v); err != nil {
						bDone <- err
						return
					}
					if v != i+1 {
						stale++
					}
					bRead <- v
					bDone <- nil
				}()
				waitFor(t, 5*time.Second, "B to wait for the lock", func() bool { return db.Stats().InUse == 2 })
				if err := a.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := <-bDone; err != nil {
					t.Fatal(err)
				}
			}
			if broken && stale == 0 {
				t.Error("the broken variant was never caught: the test cannot see a release before commit")
			}
			if !broken && stale != 0 {
				t.Errorf("B read a stale value %d times of %d", stale, iterations)
			}
		})
	}
}
