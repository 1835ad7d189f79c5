package lockhooks

// The SQLite writer lock: writers queue in the process instead of meeting
// SQLITE_BUSY, the holder's site is named, read-only statements pass.

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/inprocess"
)

// isBusy reports an SQLITE_BUSY (or SQLITE_LOCKED) from modernc.
func isBusy(err error) bool {
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		code := lite.Code() & 0xff
		return code == 5 || code == 6
	}
	return false
}

// Transactions that read and then write: the deferred BEGIN of raw modernc
// fails with SQLITE_BUSY at the write; lockhooks begins them IMMEDIATE
// under its writer lock.
func TestReadThenWriteHasNoBusy(t *testing.T) {
	const workers, txs = 8, 25
	run := func(db *sql.DB) (failures int64) {
		var n atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range txs {
					err := func() error {
						tx, err := db.Begin()
						if err != nil {
							return err
						}
						defer tx.Rollback()
						var v int
						if err := tx.QueryRow("SELECT v FROM c WHERE id = 1").Scan(&v); err != nil {
							return err
						}
						if _, err := tx.Exec("UPDATE c SET v = ? WHERE id = 1", v+1); err != nil {
							return err
						}
						return tx.Commit()
					}()
					if err != nil {
						n.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return n.Load()
	}
	db, path := openSQLiteFile(t)
	mustExec(t, db, "CREATE TABLE c (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); INSERT INTO c VALUES (1, 0)")
	if f := run(db); f != 0 {
		t.Errorf("lockhooks: %d failed transactions", f)
	}
	var v int
	if err := db.QueryRow("SELECT v FROM c").Scan(&v); err != nil || v != workers*txs {
		t.Errorf("counter %d (%v), want %d", v, err, workers*txs)
	}
	raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	f := run(raw)
	t.Logf("raw modernc with busy_timeout=5000: %d of %d transactions failed", f, workers*txs)
	if f == 0 {
		t.Error("the raw driver had no failure: the workload does not show what it should")
	}
}

func TestWriterLock(t *testing.T) {
	db, _ := openSQLiteFile(t, WithBusyTimeout(100*time.Millisecond))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	first := beginTx(t, db, nil)
	// The waiters run on this goroutine with a context of their own: not
	// the holder's call chain, so they wait (TestSelfWait* has the rest).
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()

	// Writers have never waited. Where frame pointers make a stack capture
	// cheap (amd64, arm64), the holder's site is recorded anyway; elsewhere
	// it is not (a stack walk each write transaction would pay for), and
	// the error says so and names its connection.
	_, err := db.BeginTx(other, nil)
	if !errors.Is(err, ErrWriterLockTimeout) || !strings.Contains(err.Error(), "connection #") {
		t.Fatalf("a second writer: %v, want ErrWriterLockTimeout naming the holder's connection", err)
	}
	if want := "not recorded"; !callsite.FastCapture && !strings.Contains(err.Error(), want) {
		t.Errorf("a second writer: %v, want %q", err, want)
	} else if want := "transaction begun at"; callsite.FastCapture && !strings.Contains(err.Error(), want) {
		t.Errorf("a second writer: %v, want %q", err, want)
	}
	first.Rollback()
	if connectorOf(t, db).writer.core.SiteWanted() {
		t.Error("the request for the site outlived the holder")
	}

	// Writers waited within the last minute: a new holder records where it
	// began.
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	_, err = db.BeginTx(other, nil)
	if !errors.Is(err, ErrWriterLockTimeout) || !strings.Contains(err.Error(), "_test.go:") || !strings.Contains(err.Error(), "transaction begun at") {
		t.Fatalf("a writer after contention: %v, want ErrWriterLockTimeout naming where the holder began", err)
	}
	if _, err := db.ExecContext(other, "INSERT INTO t VALUES (1)"); !errors.Is(err, ErrWriterLockTimeout) {
		t.Fatalf("an autocommit write: %v, want ErrWriterLockTimeout", err)
	}
	// A writer waiting for an autocommit statement is told the statement.
	var w writerLock
	if err := w.lock(context.Background(), noTelemetry, 1, 0, "INSERT INTO big VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := w.lock(context.Background(), noTelemetry, 2, 10*time.Millisecond, ""); err == nil || !strings.Contains(err.Error(), "INSERT INTO big") {
		t.Fatalf("waiting for a statement: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1)"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an autocommit write with a short context: %v", err)
	}
	// Readers do not wait.
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	ro := beginTx(t, db, readOnly)
	ro.Rollback()
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "INSERT INTO t VALUES (1)")
}

// A writer that waits for a transaction whose site was not recorded asks
// for it; the holder's next statement records where it runs.
func TestWriterLockHolderSiteAtNextStatement(t *testing.T) {
	if callsite.FastCapture {
		t.Skip("SKIP: with frame-pointer captures (amd64, arm64) every write transaction records where it began; the next-statement fallback serves other architectures")
	}
	db, _ := openSQLiteFile(t, WithBusyTimeout(time.Minute))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY)")
	w := &connectorOf(t, db).writer
	holder := beginTx(t, db, nil)
	defer holder.Rollback()
	if h, _ := inprocess.WriterHolderOf(&w.core); h.Location() != "not recorded" {
		t.Fatalf("an uncontended holder's site: %q, want not recorded", h.Location())
	}

	waited := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(context.Background(), nil)
		if err == nil {
			err = tx.Rollback()
		}
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !w.core.SiteWanted() {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never asked for the holder's site")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := holder.Exec("INSERT INTO t VALUES (1)"); err != nil { // the holder's next statement
		t.Fatal(err)
	}
	h, _ := inprocess.WriterHolderOf(&w.core)
	if !strings.Contains(h.Location(), "_test.go:") || !strings.Contains(h.Location(), "a later statement") {
		t.Errorf("the holder's site after its next statement: %q", h.Location())
	}
	if d := h.Describe(ownerHolder); !strings.Contains(d, "that ran a statement at") {
		t.Errorf("the holder described as %q", d)
	}
	if w.core.SiteWanted() {
		t.Error("the request for the site is still pending")
	}
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if _, held := inprocess.WriterHolderOf(&w.core); held {
		t.Error("the writer lock is still held")
	}
}

func TestSQLiteConnectionDefaults(t *testing.T) {
	pragma := func(db *sql.DB, name string) string {
		var v string
		if err := db.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	db, _ := openSQLiteFile(t)
	for name, want := range map[string]string{"journal_mode": "wal", "foreign_keys": "1", "busy_timeout": "5000"} {
		if got := pragma(db, name); got != want {
			t.Errorf("PRAGMA %s = %s, want %s", name, got, want)
		}
	}
	own, err := Open("sqlite", filepath.Join(t.TempDir(), "own.db")+"?_pragma=foreign_keys(0)&_pragma=busy_timeout(123)")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if got := pragma(own, "foreign_keys"); got != "0" {
		t.Errorf("the DSN's foreign_keys(0) was overridden: %s", got)
	}
	if got := pragma(own, "busy_timeout"); got != "123" {
		t.Errorf("the DSN's busy_timeout was overridden: %s", got)
	}
}

// A read-only CTE that calls replace() is a read: its open rows do not hold
// the writer lock, so a writer in the same process goes ahead (issue 11).
func TestReadOnlyCTEDoesNotTakeTheWriterLock(t *testing.T) {
	db, _ := openSQLiteFile(t, WithBusyTimeout(200*time.Millisecond))
	mustExec(t, db, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
	mustExec(t, db, "INSERT INTO t VALUES (1, 'a b'), (2, 'c d')")
	rows, err := db.Query("WITH x AS (SELECT replace(name, ' ', '-') AS n FROM t) SELECT n FROM x")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		t.Fatal(rows.Err())
	}
	if _, err := db.Exec("INSERT INTO t VALUES (3, 'e f')"); err != nil {
		t.Fatalf("a writer while the CTE's rows are open: %v", err)
	}
	// A WITH … INSERT still takes it.
	tx := beginTx(t, db, nil)
	defer tx.Rollback()
	other, cancel := context.WithCancel(context.Background()) // not the holder's call chain: it waits (see ErrSelfWait)
	defer cancel()
	if _, err := db.ExecContext(other, "WITH x AS (SELECT 4 AS id) INSERT INTO t SELECT id, 'g' FROM x"); !errors.Is(err, ErrWriterLockTimeout) {
		t.Fatalf("a WITH … INSERT while a write transaction is open: %v, want ErrWriterLockTimeout", err)
	}
}
