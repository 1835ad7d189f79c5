package lockhooks

import (
	"context"
	"database/sql"
	"testing"

	"modernc.org/sqlite"
)

func TestParseSQLiteDSN(t *testing.T) {
	for _, c := range []struct {
		dsn  string
		want sqliteDSN
	}{
		{"", sqliteDSN{}},
		{"app.db", sqliteDSN{known: true}},
		// Words in the path decide nothing.
		{"/data/trade_journal_fk_timeout_busy_foreign_keys.db", sqliteDSN{known: true}},
		{"file:/tmp/busy_timeout.db?cache=shared", sqliteDSN{known: true}},
		{"/data/x_journal_mode=wal/app.db?_time_format=sqlite", sqliteDSN{known: true}},
		{"app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(wal)&_pragma=foreign_keys(1)",
			sqliteDSN{known: true, busyTimeout: true, journalMode: true, foreignKeys: true}},
		// Pragma names are case-insensitive, take = or (), and a schema.
		{"app.db?_pragma=Journal_Mode%20%3D%20DELETE&_pragma=main.FOREIGN_KEYS(0)&_pragma=%20busy_timeout=1",
			sqliteDSN{known: true, busyTimeout: true, journalMode: true, foreignKeys: true}},
		// Query keys are case-sensitive, as modernc reads them.
		{"app.db?_PRAGMA=journal_mode(delete)&_TXLOCK=exclusive", sqliteDSN{known: true}},
		// The mattn-style shorthands modernc accepts; an empty value sets nothing.
		{"app.db?_busy_timeout=10&_journal=DELETE&_fk=1", sqliteDSN{known: true, busyTimeout: true, journalMode: true, foreignKeys: true}},
		{"app.db?_timeout=10&_journal_mode=WAL&_foreign_keys=on", sqliteDSN{known: true, busyTimeout: true, journalMode: true, foreignKeys: true}},
		{"app.db?_busy_timeout=10&_timeout=&_fk=", sqliteDSN{known: true}},
		// Read-only opens.
		{"file:app.db?mode=ro", sqliteDSN{known: true, readOnly: "mode=ro"}},
		{"file:app.db?mode=rw", sqliteDSN{known: true}},
		{"file:app.db?immutable=1", sqliteDSN{known: true, readOnly: "immutable=1"}},
		{"file:app.db?immutable=0", sqliteDSN{known: true}},
		{"app.db?_pragma=query_only(1)", sqliteDSN{known: true, readOnly: "_pragma=query_only"}},
		{"app.db?_pragma=query_only=ON", sqliteDSN{known: true, readOnly: "_pragma=query_only"}},
		{"app.db?_pragma=query_only(0)", sqliteDSN{known: true}},
		{"app.db?_query_only=true", sqliteDSN{known: true, readOnly: "_query_only"}},
		// _txlock, case-insensitive as modernc reads it.
		{"app.db?_txlock=EXCLUSIVE", sqliteDSN{known: true, txlock: "exclusive", txlockGiven: true}},
		{"app.db?_txlock=deferred&_time_format=sqlite", sqliteDSN{known: true, txlock: "deferred", txlockGiven: true}},
		{"app.db?_txlock=", sqliteDSN{known: true, txlockGiven: true}},
		// An unparsable query: the driver refuses it; lockhooks decides nothing.
		{"app.db?_pragma=%zz", sqliteDSN{}},
	} {
		if got := parseSQLiteDSN(c.dsn); got != c.want {
			t.Errorf("parseSQLiteDSN(%q) = %+v, want %+v", c.dsn, got, c.want)
		}
	}
}

// planModerncBegin lets modernc begin write transactions itself where the
// DSN's _txlock says IMMEDIATE or EXCLUSIVE (driverBegins), and tells
// modernc connections to begin IMMEDIATE where the DSN has no _txlock
// (setBeginMode); the DSN itself is never changed (TestConnectionHooksSeeTheUsersDSN).
func TestPlanModerncBegin(t *testing.T) {
	for _, c := range []struct {
		dsn                        string
		driverBegins, setBeginMode bool
	}{
		{"app.db", false, true},
		{":memory:", false, true},
		{"file:app.db?cache=shared", false, true},
		{"app.db?", false, true},
		{"?app.db", false, true}, // modernc reads no query here: no _txlock
		{"app.db?_txlock=immediate", true, false},
		{"app.db?_txlock=Exclusive", true, false},
		// lockhooks still begins these IMMEDIATE itself.
		{"app.db?_txlock=deferred", false, false},
		{"app.db?_txlock=", false, false}, // modernc reads the first, empty value
		{"", false, false},
		{"app.db?_pragma=%zz", false, false},
		// A read-only open begins nothing IMMEDIATE.
		{"file:app.db?mode=ro", false, false},
		{"file:app.db?mode=ro&_txlock=immediate", false, false},
	} {
		d := parseSQLiteDSN(c.dsn)
		d.planModerncBegin(&sqlite.Driver{})
		if d.driverBegins != c.driverBegins || d.setBeginMode != c.setBeginMode {
			t.Errorf("planModerncBegin(%q): driverBegins %v, setBeginMode %v; want %v, %v", c.dsn, d.driverBegins, d.setBeginMode, c.driverBegins, c.setBeginMode)
		}
	}
	// Another driver is left to lockhooks' own BEGIN IMMEDIATE.
	d := parseSQLiteDSN("app.db?_txlock=immediate")
	if d.planModerncBegin(fakeDriver{}); d.driverBegins || d.setBeginMode {
		t.Errorf("another driver: driverBegins %v, setBeginMode %v", d.driverBegins, d.setBeginMode)
	}
}

// The modernc internals lockhooks relies on (sqlite_modernc.go) are there
// in the modernc version of go.mod. If this fails after an upgrade,
// lockhooks still works but runs BEGIN IMMEDIATE and COMMIT itself (slower,
// and TestSQLiteWriteTransactionAllocations fails): adapt sqlite_modernc.go.
func TestModerncInternals(t *testing.T) {
	const dsn = ":memory:?_pragma=busy_timeout(1000)"
	cn, err := sqlite.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := moderncConnectorDSN(cn); !ok || got != dsn {
		t.Errorf("moderncConnectorDSN = %q, %v; want %q, true", got, ok, dsn)
	}
	dc, err := cn.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if !beginModerncImmediate(dc) {
		t.Fatal("beginModerncImmediate could not set a modernc connection's begin mode")
	}
	if beginModerncImmediate(dc) {
		t.Error("beginModerncImmediate changed a begin mode that was already set")
	}
	if f, _ := moderncField(dc, "conn", "beginMode"); f.String() != "immediate" {
		t.Errorf("beginMode %q, want immediate", f.String())
	}
	// Anything else is left alone.
	if beginModerncImmediate(nil) || beginModerncImmediate(newFakeConn()) {
		t.Error("beginModerncImmediate accepted a connection that is not modernc's")
	}
	if _, ok := moderncConnectorDSN(dsnConnector{dsn: dsn}); ok {
		t.Error("moderncConnectorDSN read another connector")
	}
}

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
