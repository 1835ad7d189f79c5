package lockhooks

import (
	"context"
	"database/sql"
	"testing"

	"modernc.org/sqlite"
)

// However lockhooks or modernc runs the BEGIN, a write transaction holds
// SQLite's write lock from BEGIN on (another connection's write fails at
// once with busy_timeout 0), and a read-only one holds nothing until it
// reads.
func TestSQLiteWriteTransactionsBeginImmediate(t *testing.T) {
	for _, c := range []struct {
		name, params string
		connector    bool
		driverBegins bool
	}{
		{"no _txlock", "", false, true},
		{"immediate", "_txlock=immediate", false, true},
		{"deferred", "_txlock=deferred", false, false},
		{"exclusive", "_txlock=exclusive", false, true},
		{"connector", "", true, true},
		{"connector immediate", "_txlock=immediate", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path, _ := createRollbackJournalFile(t, "begin.db")
			dsn := path + "?_pragma=journal_mode(delete)"
			if c.params != "" {
				dsn += "&" + c.params
			}
			var db *sql.DB
			if c.connector {
				cn, err := sqlite.NewConnector(dsn)
				if err != nil {
					t.Fatal(err)
				}
				db = OpenDB(cn)
			} else {
				var err error
				if db, err = Open("sqlite", dsn); err != nil {
					t.Fatal(err)
				}
			}
			defer db.Close()
			if got := driverBegins(t, db); got != c.driverBegins {
				t.Errorf("driverBegins %v, want %v", got, c.driverBegins)
			}
			raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()

			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Exec("INSERT INTO t VALUES (10, 'raw')"); !isBusy(err) {
				t.Errorf("another connection's write during a write transaction that has run nothing: %v, want SQLITE_BUSY", err)
			}
			if _, err := tx.Exec("INSERT INTO t VALUES (2, 'c')"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			ro, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Exec("INSERT INTO t VALUES (11, 'raw')"); err != nil {
				t.Errorf("another connection's write during a read-only transaction that has read nothing: %v", err)
			}
			ro.Rollback()
			if n := countRows(t, db, "t"); n != 3 {
				t.Errorf("%d rows, want 3", n)
			}
		})
	}
}

// driverBegins reports whether a connection of db lets the driver begin
// write transactions (modernc told to begin IMMEDIATE, or its _txlock).
func driverBegins(t *testing.T, db *sql.DB) bool {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return trackedConn(t, c).driverBegins
}

// connectorOf returns db's lockhooks connector.
func connectorOf(t testing.TB, db *sql.DB) *connector {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return trackedConn(t, c).connector
}
