package lockhooks

// lockhooks' SQLite connection defaults: a read-only open never writes, the
// defaults ignore the path and keep the DSN's settings, COMMIT honours the
// transaction's context, txlock=exclusive, and the connection hooks.

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"modernc.org/sqlite"
)

// createRollbackJournalFile creates an SQLite file with one row the way
// another program would (modernc, no lockhooks, journal_mode DELETE) and
// returns its path and bytes.
func createRollbackJournalFile(t *testing.T, name string) (path string, content []byte) {
	t.Helper()
	path = filepath.Join(t.TempDir(), name)
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, raw, "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
	mustExec(t, raw, "INSERT INTO t VALUES (1, 'a b')")
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	content, err = os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, content
}

// fileJournalMode reads the journal mode a database file is in from its
// header: bytes 18 and 19 are 2 in WAL mode, 1 for a rollback journal.
func fileJournalMode(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 20 {
		t.Fatalf("%s: %d bytes, not an SQLite file", path, len(b))
	}
	if b[18] == 2 && b[19] == 2 {
		return "wal"
	}
	return "rollback"
}

// A read-only open never writes to the file: it works on a file in
// rollback-journal mode, and the file's bytes are unchanged afterwards.
func TestSQLiteReadOnlyOpenNeverWrites(t *testing.T) {
	for _, params := range []string{"mode=ro", "_pragma=query_only(1)", "_query_only=1", "immutable=1", "mode=ro&_txlock=immediate"} {
		t.Run(params, func(t *testing.T) {
			path, before := createRollbackJournalFile(t, "ro.db")
			db, err := Open("sqlite", "file:"+path+"?"+params)
			if err != nil {
				t.Fatal(err)
			}
			var name string
			if err := db.QueryRow("WITH x AS (SELECT replace(name, ' ', '-') AS n FROM t) SELECT n FROM x").Scan(&name); err != nil {
				t.Fatalf("reading through %s: %v", params, err)
			}
			if name != "a-b" {
				t.Fatalf("read %q", name)
			}
			// A transaction that is not marked read-only begins as the
			// driver begins it (BEGIN IMMEDIATE fails under query_only).
			tx, err := db.Begin()
			if err != nil {
				t.Fatalf("Begin through %s: %v", params, err)
			}
			if err := tx.QueryRow("SELECT name FROM t").Scan(&name); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// The connection defaults that do not write are still there.
			var busy int
			if err := db.QueryRow("PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 5000 {
				t.Errorf("busy_timeout %d, %v; want 5000", busy, err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("the file changed under a read-only open (%s); journal mode now %s", params, fileJournalMode(t, path))
			}
			if _, err := os.Stat(path + "-wal"); err == nil {
				t.Errorf("a -wal file appeared under %s", params)
			}
		})
	}
}

// A modernc connector's read-only open begins every transaction as the
// driver begins it, as a DSN's does (BEGIN IMMEDIATE fails under
// query_only; with _txlock=immediate the driver's own BEGIN fails, with or
// without lockhooks).
func TestSQLiteReadOnlyConnectorBeginsAsTheDriver(t *testing.T) {
	for _, params := range []string{"_pragma=query_only(1)", "mode=ro"} {
		t.Run(params, func(t *testing.T) {
			path, before := createRollbackJournalFile(t, "ro.db")
			cn, err := sqlite.NewConnector("file:" + path + "?" + params)
			if err != nil {
				t.Fatal(err)
			}
			db := OpenDB(cn)
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatalf("BeginTx through a read-only connector: %v", err)
			}
			var name string
			if err := tx.QueryRow("SELECT name FROM t").Scan(&name); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
				t.Errorf("the file changed under a read-only connector (%v)", err)
			}
		})
	}
}

// Defaults are decided by the DSN's parameters, not by words in its path.
func TestSQLiteDefaultsIgnoreThePath(t *testing.T) {
	for _, name := range []string{"trade_journal.db", "orders_fk.db", "job_timeout.db", "foreign_keys.db", "busy_timeout.db", "x_journal_mode=delete.db"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), name)
			db, err := Open("sqlite", path+"?_time_format=sqlite")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for pragma, want := range map[string]string{"journal_mode": "wal", "foreign_keys": "1", "busy_timeout": "5000"} {
				var got string
				if err := db.QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("PRAGMA %s = %s, want %s", pragma, got, want)
				}
			}
		})
	}
}

// The user's own settings, in every form modernc accepts, are left alone.
func TestSQLiteDefaultsKeepTheDSNsSettings(t *testing.T) {
	for dsn, want := range map[string]map[string]string{
		"?_pragma=JOURNAL_MODE(delete)&_pragma=Foreign_Keys(0)&_pragma=busy_timeout(123)": {"journal_mode": "delete", "foreign_keys": "0", "busy_timeout": "123"},
		"?_journal=TRUNCATE&_fk=0&_timeout=77":                                            {"journal_mode": "truncate", "foreign_keys": "0", "busy_timeout": "77"},
		"?_txlock=exclusive":                                                              {"journal_mode": "delete", "foreign_keys": "1", "busy_timeout": "5000"},
	} {
		db, err := Open("sqlite", filepath.Join(t.TempDir(), "own.db")+dsn)
		if err != nil {
			t.Fatal(err)
		}
		for pragma, w := range want {
			var got string
			if err := db.QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != w {
				t.Errorf("%s: PRAGMA %s = %s, want %s", dsn, pragma, got, w)
			}
		}
		db.Close()
	}
}

// holdSharedLock opens path without lockhooks and keeps a SHARED lock on it
// (rollback journal) until the returned function is called.
func holdSharedLock(t *testing.T, path string) (release func()) {
	t.Helper()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := raw.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := reader.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return func() { reader.Rollback(); raw.Close() }
}

// COMMIT of a write transaction waits for another connection's lock only
// as long as BeginTx's context allows, whether modernc runs it (no
// _txlock: lockhooks tells modernc to begin IMMEDIATE) or lockhooks does
// (_txlock=deferred), and the writer lock is free afterwards.
func TestSQLiteCommitHonoursTheTransactionsContext(t *testing.T) {
	for name, params := range map[string]string{"modernc begins": "", "lockhooks begins": "&_txlock=deferred"} {
		t.Run(name, func(t *testing.T) {
			path, _ := createRollbackJournalFile(t, "commit.db")
			db, err := Open("sqlite", path+"?_pragma=journal_mode(delete)&_pragma=busy_timeout(3000)"+params, WithBusyTimeout(3*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if got, want := driverBegins(t, db), params == ""; got != want {
				t.Fatalf("driverBegins %v, want %v", got, want)
			}

			release := holdSharedLock(t, path)
			defer release()

			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (2, 'c')"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = tx.Commit()
			elapsed := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("COMMIT against a reader's SHARED lock with a 100ms context: %v after %v, want context.DeadlineExceeded", err, elapsed)
			}
			if elapsed > 2*time.Second {
				t.Errorf("COMMIT returned after %v: it waited for the busy timeout, not the context", elapsed)
			}
			t.Logf("COMMIT returned %v after %v", err, elapsed)

			// The writer lock is free: another write transaction begins at once.
			ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
			defer cancel2()
			tx2, err := db.BeginTx(ctx2, nil)
			if err != nil {
				t.Fatalf("a write transaction after the failed COMMIT: %v (the writer lock was not released)", err)
			}
			tx2.Rollback()
			release()
			if n := countRows(t, db, "t"); n != 1 {
				t.Errorf("%d rows after the failed COMMIT, want 1 (rolled back)", n)
			}
		})
	}
}

// _txlock=exclusive is honoured: during a write transaction a reader on
// another connection is kept out, as without lockhooks; and lockhooks
// leaves the file in its rollback journal (WAL would let readers in). A
// modernc connector's _txlock is honoured too.
func TestSQLiteTxlockExclusiveKeepsReadersOut(t *testing.T) {
	for how, open := range map[string]func(dsn string) (*sql.DB, error){
		"Open": func(dsn string) (*sql.DB, error) { return Open("sqlite", dsn) },
		"OpenDB": func(dsn string) (*sql.DB, error) {
			c, err := sqlite.NewConnector(dsn)
			if err != nil {
				return nil, err
			}
			return OpenDB(c), nil
		},
	} {
		t.Run(how, func(t *testing.T) {
			path, _ := createRollbackJournalFile(t, "exclusive.db")
			db, err := open(path + "?_txlock=exclusive")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.Exec("INSERT INTO t VALUES (2, 'c')"); err != nil {
				t.Fatal(err)
			}

			raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			var n int
			err = raw.QueryRow("SELECT count(*) FROM t").Scan(&n)
			if !isBusy(err) {
				t.Fatalf("a reader on another connection during an EXCLUSIVE transaction: %v (read %d rows), want SQLITE_BUSY", err, n)
			}
			// A lockhooks reader of the same database is kept out too.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err == nil {
				t.Fatalf("a lockhooks reader read %d rows during an EXCLUSIVE transaction", n)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := raw.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
				t.Fatalf("after COMMIT: %d rows, %v", n, err)
			}
			if mode := fileJournalMode(t, path); mode != "rollback" {
				t.Errorf("the file is in %s mode", mode)
			}
		})
	}
}

// lockhooks' own BEGIN, COMMIT and ROLLBACK reach a driver without an
// Execer through Prepare.
func TestSQLiteOwnStatementsWithoutAnExecer(t *testing.T) {
	for _, end := range []string{"Commit", "Rollback"} {
		fc := newFakeConn()
		w := newConn(testConnector(t), fakeConnWith(fc, 0))
		if _, ok := w.(driver.ExecerContext); ok {
			t.Fatal("the test double has an Execer")
		}
		tx, err := w.Begin() //nolint:staticcheck // the inner driver has no BeginTx
		if err != nil {
			t.Fatal(err)
		}
		if end == "Commit" {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		if n := countCalls(fc.calls, "Prepare"); n != 2 {
			t.Errorf("%s: %d statements prepared (%v), want BEGIN and the end", end, n, fc.calls)
		}
	}
}

func countCalls(calls []string, name string) int {
	n := 0
	for _, c := range calls {
		if c == name {
			n++
		}
	}
	return n
}

// A connection hook of modernc's receives the DSN the user wrote, byte for
// byte, through Register, Open and OpenDB (issue 24: lockhooks once
// appended _txlock=immediate), and the write transactions still begin
// IMMEDIATE in modernc's own BeginTx.
func TestConnectionHooksSeeTheUsersDSN(t *testing.T) {
	seen := hookSeen
	for len(seen) > 0 { // a run before, with -count
		<-seen
	}
	check := func(t *testing.T, db *sql.DB, want string) {
		t.Helper()
		defer db.Close()
		if _, err := db.Exec("CREATE TABLE IF NOT EXISTS t (id INTEGER)"); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-seen:
			if got != want {
				t.Errorf("the connection hook saw %q, want the user's %q", got, want)
			}
		default:
			t.Fatal("the connection hook did not run")
		}
		if !driverBegins(t, db) {
			t.Error("modernc does not begin the write transactions itself (lockhooks runs BEGIN IMMEDIATE: slower)")
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	// A driver of the user's own, registered under a name of the test's.
	const inner = "sqlite-hooktest"
	if !slices.Contains(sql.Drivers(), inner) { // -count=N runs the test again
		d := &sqlite.Driver{}
		d.RegisterConnectionHook(recordHookDSN)
		sql.Register(inner, d)
	}
	dir := t.TempDir()

	t.Run("Register", func(t *testing.T) {
		name, err := Register(inner)
		if err != nil {
			t.Fatal(err)
		}
		dsn := filepath.Join(dir, "register.db") + "?hooktest=1&_pragma=foreign_keys(1)"
		db, err := sql.Open(name, dsn)
		if err != nil {
			t.Fatal(err)
		}
		check(t, db, dsn)
	})
	t.Run("Open", func(t *testing.T) {
		dsn := "file:" + filepath.Join(dir, "open.db") + "?hooktest=2"
		db, err := Open(inner, dsn)
		if err != nil {
			t.Fatal(err)
		}
		check(t, db, dsn)
	})
	t.Run("OpenDB", func(t *testing.T) {
		// sqlite.NewConnector connects through the driver registered as
		// "sqlite", whose hooks are process-wide: this one records only
		// DSNs with the test's parameter.
		registerGlobalHook.Do(func() { sqlite.RegisterConnectionHook(recordHookDSN) })
		dsn := filepath.Join(dir, "opendb.db") + "?hooktest=3"
		cn, err := sqlite.NewConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		check(t, OpenDB(cn), dsn)
	})
}

// The connection hook of TestConnectionHooksSeeTheUsersDSN: drivers and
// their hooks outlive a test run, so it reports to a channel of the test
// binary, and only DSNs with the test's parameter.
var (
	hookSeen           = make(chan string, 16)
	registerGlobalHook sync.Once
)

func recordHookDSN(_ sqlite.ExecQuerierContext, dsn string) error {
	if strings.Contains(dsn, "hooktest=") {
		select {
		case hookSeen <- dsn:
		default:
		}
	}
	return nil
}
