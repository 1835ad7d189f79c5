package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // registers "postgres"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// pgLockErrors provokes, through db (any Postgres driver), a real
// lock_not_available (NOWAIT), serialization failure (REPEATABLE READ
// conflict) and deadlock (two connections locking two rows in opposite
// orders), and returns the three errors.
func pgLockErrors(t *testing.T, db *sql.DB) (nowait, serialization, deadlock error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustExec(t, db, "CREATE TABLE rows2 (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
	mustExec(t, db, "INSERT INTO rows2 VALUES (1, 0), (2, 0)")
	begin := func(opts *sql.TxOptions) *sql.Tx {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}

	a := begin(nil)
	mustExec(t, a, "SELECT v FROM rows2 WHERE id = 1 FOR UPDATE")
	b := begin(nil)
	_, nowait = b.ExecContext(ctx, "SELECT v FROM rows2 WHERE id = 1 FOR UPDATE NOWAIT")
	b.Rollback()
	a.Rollback()

	rr := begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	mustExec(t, rr, "SELECT v FROM rows2 WHERE id = 1")
	mustExec(t, db, "UPDATE rows2 SET v = v + 1 WHERE id = 1")
	_, serialization = rr.ExecContext(ctx, "UPDATE rows2 SET v = v + 1 WHERE id = 1")
	rr.Rollback()

	a, b = begin(nil), begin(nil)
	for _, tx := range []*sql.Tx{a, b} {
		mustExec(t, tx, "SET LOCAL deadlock_timeout = '10ms'")
	}
	mustExec(t, a, "UPDATE rows2 SET v = v + 1 WHERE id = 1")
	mustExec(t, b, "UPDATE rows2 SET v = v + 1 WHERE id = 2")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, step := range []struct {
		tx *sql.Tx
		id int
	}{{a, 2}, {b, 1}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = step.tx.ExecContext(ctx, fmt.Sprintf("UPDATE rows2 SET v = v + 1 WHERE id = %d", step.id))
			step.tx.Rollback()
		}()
	}
	wg.Wait()
	deadlock = errors.Join(errs...)
	if errs[0] != nil && errs[1] != nil {
		t.Fatalf("both transactions failed: %v", deadlock)
	}
	return nowait, serialization, deadlock
}

// checkPGClassification asserts what each helper says about the three
// errors and a syntax error.
func checkPGClassification(t *testing.T, db *sql.DB) {
	nowait, serialization, deadlock := pgLockErrors(t, db)
	_, syntax := db.Exec("SELEC 1")
	for _, c := range []struct {
		name                                     string
		err                                      error
		deadlock, serialization, lock, retryable bool
	}{
		{"NOWAIT", nowait, false, false, true, false},
		{"REPEATABLE READ conflict", serialization, false, true, false, true},
		{"deadlock", deadlock, true, false, false, true},
		{"syntax error", syntax, false, false, false, false},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		wrapped := fmt.Errorf("the application wraps it: %w", c.err)
		if IsDeadlock(wrapped) != c.deadlock || IsSerializationFailure(wrapped) != c.serialization ||
			IsLockNotAvailable(wrapped) != c.lock || IsRetryable(wrapped) != c.retryable {
			t.Errorf("%s (%T: %v): deadlock %v, serialization %v, lock not available %v, retryable %v; want %v %v %v %v",
				c.name, c.err, c.err, IsDeadlock(wrapped), IsSerializationFailure(wrapped), IsLockNotAvailable(wrapped), IsRetryable(wrapped),
				c.deadlock, c.serialization, c.lock, c.retryable)
		}
	}
}

func TestClassificationPgx(t *testing.T) {
	db, err := sql.Open("pgx", pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkPGClassification(t, db)
}

func TestClassificationLibPQ(t *testing.T) {
	dsn := pgtest.DSN(t)
	if !strings.Contains(dsn, "sslmode") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "sslmode=disable"
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkPGClassification(t, db)
}

// TestClassificationThroughLockhooks: the same errors through the wrapper,
// where a deadlock becomes a *DeadlockError that names the locks held.
func TestClassificationThroughLockhooks(t *testing.T) {
	for _, name := range []string{"pgx", "postgres"} {
		t.Run(name, func(t *testing.T) {
			dsn := pgtest.DSN(t)
			if name == "postgres" && !strings.Contains(dsn, "sslmode") {
				dsn += map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")] + "sslmode=disable"
			}
			db, err := Open(name, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			checkPGClassification(t, db)
		})
	}
}

// TestClassificationModernc: SQLITE_BUSY from a second writer with no busy
// timeout, SQLITE_LOCKED from a table dropped under an open cursor, and
// lockhooks' own writer-lock timeout.
func TestClassificationModernc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(), open()
	mustExec(t, a, "CREATE TABLE t (v INTEGER)")
	mustExec(t, a, "INSERT INTO t VALUES (1)")
	ctx := context.Background()
	ca, err := a.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	mustExec(t, ca, "BEGIN IMMEDIATE")
	_, busy := b.Exec("INSERT INTO t VALUES (2)")
	mustExec(t, ca, "ROLLBACK")

	tx, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	locked := sqliteLockedError(ctx, tx)
	tx.Rollback()

	w := openSQLite(t, WithBusyTimeout(time.Millisecond))
	hold, err := w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, cancelOther := context.WithCancel(ctx) // not the holder's call chain: it waits (see ErrSelfWait)
	defer cancelOther()
	_, writerTimeout := w.ExecContext(other, "CREATE TABLE u (v INTEGER)")
	hold.Rollback()

	for _, c := range []struct {
		name                                     string
		err                                      error
		deadlock, serialization, lock, retryable bool
	}{
		{"SQLITE_BUSY", busy, false, false, true, true},
		{"SQLITE_LOCKED", locked, false, false, true, true},
		{"writer lock timeout", writerTimeout, false, false, true, true},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if IsDeadlock(c.err) != c.deadlock || IsSerializationFailure(c.err) != c.serialization ||
			IsLockNotAvailable(c.err) != c.lock || IsRetryable(c.err) != c.retryable {
			t.Errorf("%s (%T: %v): deadlock %v, serialization %v, lock not available %v, retryable %v",
				c.name, c.err, c.err, IsDeadlock(c.err), IsSerializationFailure(c.err), IsLockNotAvailable(c.err), IsRetryable(c.err))
		}
	}
}

// TestDeadlockErrorNamesHeldLocks: a deadlock victim's error, through the
// wrapper, names its lockset ids, advisory keys and FOR UPDATE tables
// beside Postgres's DETAIL.
func TestDeadlockErrorNamesHeldLocks(t *testing.T) {
	db := openPG(t)
	mustExec(t, db, "CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
	mustExec(t, db, "INSERT INTO items VALUES (1, 0), (2, 0)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := beginTx(t, db, nil), beginTx(t, db, nil)
	for _, tx := range []*sql.Tx{a, b} {
		mustExec(t, tx, "SET LOCAL deadlock_timeout = '10ms'")
	}
	if err := Lock(ctx, a, "jobs", 7, 3); err != nil {
		t.Fatal(err)
	}
	mustExec(t, a, "SELECT pg_advisory_xact_lock(4242)")
	mustExec(t, a, "SELECT v FROM items WHERE id = 1 FOR UPDATE")
	mustExec(t, b, "SELECT v FROM items WHERE id = 2 FOR UPDATE")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, step := range []struct {
		tx *sql.Tx
		id int
	}{{a, 2}, {b, 1}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = step.tx.ExecContext(ctx, "SELECT v FROM items WHERE id = $1 FOR UPDATE", step.id)
			step.tx.Rollback()
		}()
	}
	wg.Wait()
	var de *DeadlockError
	err := errors.Join(errs...)
	if !errors.As(err, &de) || !IsDeadlock(err) {
		t.Fatalf("no DeadlockError: %v", err)
	}
	msg := de.Error()
	if !strings.Contains(msg, "DETAIL: Process") || !strings.Contains(msg, "waited for rows of items (FOR NO KEY UPDATE): row (") {
		t.Errorf("the message lacks the DETAIL or the lock waited for: %s", msg)
	}
	if errs[0] != nil { // a was the victim: it held more
		for _, want := range []string{`lockset "jobs" ids 3, 7`, "advisory key 4242", "rows of items (FOR NO KEY UPDATE)"} {
			if !strings.Contains(strings.Join(de.Held, "; "), want) {
				t.Errorf("held %q lacks %q", de.Held, want)
			}
		}
	} else if len(de.Held) != 1 || de.Held[0] != "rows of items (FOR NO KEY UPDATE)" {
		t.Errorf("held %q, want the rows of items", de.Held)
	}
	t.Log(msg)
}
