package lockhooks

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgtest"
)

// wantHolderNamed fails t unless err wraps want and names the holder's
// database, where it took the lock (or began its transaction) and how
// long the caller waited.
func wantHolderNamed(t *testing.T, err, want error, parts ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want an error wrapping %v", err, want)
	}
	for _, p := range append(parts, "gave up waiting", "after ") {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("the error lacks %q: %v", p, err)
		}
	}
}

// AcquireAdvisoryLock past its context's deadline, for a key a connection
// of another *sql.DB of the process holds: the error names the holder
// (its database, where it took the lock) and still wraps the context's
// error. Without the slow-wait log, the lookup made shortly before the
// deadline (or pg_locks, read after) finds it.
func TestAdvisoryTimeoutNamesTheHolder(t *testing.T) {
	a, b := twoDatabases(t)
	ctx := context.Background()
	took := nextLine(t)
	held, err := AcquireAdvisoryLock(ctx, a, 4711)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = AcquireAdvisoryLock(short, b, 4711)
	wantHolderNamed(t, err, context.DeadlineExceeded, "advisory lock 4711", connectorOf(t, a).Pool, "which took it at "+testDir+took)
	t.Log(err)

	// Cancelled, not timed out: pg_locks names the holder after the fact.
	cctx, cancelNow := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancelNow)
	_, err = AcquireAdvisoryLock(cctx, b, 4711)
	wantHolderNamed(t, err, context.Canceled, connectorOf(t, a).Pool, "which took it at "+testDir+took)
}

// A row wait (FOR UPDATE) that lock_timeout ends: the error names the
// transaction holding the row, found by the slow-wait log.
func TestRowLockTimeoutNamesTheHolder(t *testing.T) {
	dsn := pgtest.DSN(t)
	a := openDSN(t, dsn)
	b := openDSN(t, dsn, WithSlowLockLog(50*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
	mustExec(t, a, "CREATE TABLE jobs (id int PRIMARY KEY, state text)")
	mustExec(t, a, "INSERT INTO jobs VALUES (1, 'new')")
	ctx := context.Background()
	began := nextLine(t)
	tx, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	mustExec(t, tx, "UPDATE jobs SET state = 'running' WHERE id = 1")
	done := make(chan error, 1)
	go func() { // another goroutine: on this one, it would be a self-wait
		done <- RunInTx(ctx, b, nil, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '3s'"); err != nil {
				return err
			}
			return tx.QueryRowContext(ctx, "SELECT state FROM jobs WHERE id = 1 FOR UPDATE").Scan(new(string))
		})
	}()
	err = <-done
	if !IsLockNotAvailable(err) {
		t.Fatalf("got %v, want lock_not_available", err)
	}
	wantHolderNamed(t, err, err, connectorOf(t, a).Pool, "in a transaction begun at "+testDir+began, "for \"SELECT state FROM jobs")
}

// SQLite: a writer past its context's deadline, and AcquireAdvisoryLock
// past its deadline, name the holder and wrap the context's error.
func TestSQLiteTimeoutsNameTheHolder(t *testing.T) {
	db, _ := openSQLiteFile(t, WithBusyTimeout(time.Minute))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = db.ExecContext(short, "INSERT INTO t VALUES (1)")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "SQLite writer lock after") || !strings.Contains(err.Error(), "connection #") {
		t.Errorf("writer: %v", err)
	}
	tx.Rollback()

	took := nextLine(t)
	held, err := AcquireAdvisoryLock(ctx, db, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	short2, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	_, err = AcquireAdvisoryLock(short2, db, 5)
	wantHolderNamed(t, err, context.DeadlineExceeded, "advisory lock 5", "which took it at "+testDir+took)
}
