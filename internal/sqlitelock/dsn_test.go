package sqlitelock

import (
	"context"
	"reflect"
	"testing"

	"modernc.org/sqlite"
)

func TestParseDSN(t *testing.T) {
	for _, c := range []struct {
		dsn  string
		want DSN
	}{
		{"", DSN{}},
		{"app.db", DSN{Known: true}},
		// Words in the path decide nothing.
		{"/data/trade_journal_fk_timeout_busy_foreign_keys.db", DSN{Known: true}},
		{"file:/tmp/busy_timeout.db?cache=shared", DSN{Known: true}},
		{"/data/x_journal_mode=wal/app.db?_time_format=sqlite", DSN{Known: true}},
		{"app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(wal)&_pragma=foreign_keys(1)",
			DSN{Known: true, BusyTimeout: true, JournalMode: true, ForeignKeys: true}},
		// Pragma names are case-insensitive, take = or (), and a schema.
		{"app.db?_pragma=Journal_Mode%20%3D%20DELETE&_pragma=main.FOREIGN_KEYS(0)&_pragma=%20busy_timeout=1",
			DSN{Known: true, BusyTimeout: true, JournalMode: true, ForeignKeys: true}},
		// Query keys are case-sensitive, as modernc reads them.
		{"app.db?_PRAGMA=journal_mode(delete)&_TXLOCK=exclusive", DSN{Known: true}},
		// The mattn-style shorthands modernc accepts; an empty value sets nothing.
		{"app.db?_busy_timeout=10&_journal=DELETE&_fk=1", DSN{Known: true, BusyTimeout: true, JournalMode: true, ForeignKeys: true}},
		{"app.db?_timeout=10&_journal_mode=WAL&_foreign_keys=on", DSN{Known: true, BusyTimeout: true, JournalMode: true, ForeignKeys: true}},
		{"app.db?_busy_timeout=10&_timeout=&_fk=", DSN{Known: true}},
		// Read-only opens.
		{"file:app.db?mode=ro", DSN{Known: true, ReadOnly: "mode=ro"}},
		{"file:app.db?mode=rw", DSN{Known: true}},
		{"file:app.db?immutable=1", DSN{Known: true, ReadOnly: "immutable=1"}},
		{"file:app.db?immutable=0", DSN{Known: true}},
		{"app.db?_pragma=query_only(1)", DSN{Known: true, ReadOnly: "_pragma=query_only"}},
		{"app.db?_pragma=query_only=ON", DSN{Known: true, ReadOnly: "_pragma=query_only"}},
		{"app.db?_pragma=query_only(0)", DSN{Known: true}},
		{"app.db?_query_only=true", DSN{Known: true, ReadOnly: "_query_only"}},
		// _txlock, case-insensitive as modernc reads it.
		{"app.db?_txlock=EXCLUSIVE", DSN{Known: true, TxLock: "exclusive", TxLockGiven: true}},
		{"app.db?_txlock=deferred&_time_format=sqlite", DSN{Known: true, TxLock: "deferred", TxLockGiven: true}},
		{"app.db?_txlock=", DSN{Known: true, TxLockGiven: true}},
		// An unparsable query: the driver refuses it; lockhooks decides nothing.
		{"app.db?_pragma=%zz", DSN{}},
	} {
		if got := ParseDSN(c.dsn); got != c.want {
			t.Errorf("ParseDSN(%q) = %+v, want %+v", c.dsn, got, c.want)
		}
	}
}

// PlanModerncBegin lets modernc begin write transactions itself where the
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
		d := ParseDSN(c.dsn)
		d.PlanModerncBegin(reflect.TypeFor[sqlite.Driver]().PkgPath())
		if d.DriverBegins != c.driverBegins || d.SetBeginMode != c.setBeginMode {
			t.Errorf("PlanModerncBegin(%q): driverBegins %v, setBeginMode %v; want %v, %v", c.dsn, d.DriverBegins, d.SetBeginMode, c.driverBegins, c.setBeginMode)
		}
	}
	// Another driver is left to lockhooks' own BEGIN IMMEDIATE.
	d := ParseDSN("app.db?_txlock=immediate")
	if d.PlanModerncBegin("github.com/mattn/go-sqlite3"); d.DriverBegins || d.SetBeginMode {
		t.Errorf("another driver: driverBegins %v, setBeginMode %v", d.DriverBegins, d.SetBeginMode)
	}
}

// The modernc internals lockhooks relies on (modernc.go) are there
// in the modernc version of go.mod. If this fails after an upgrade,
// lockhooks still works but runs BEGIN IMMEDIATE and COMMIT itself (slower,
// and TestSQLiteWriteTransactionAllocations fails): adapt modernc.go.
func TestModerncInternals(t *testing.T) {
	const dsn = ":memory:?_pragma=busy_timeout(1000)"
	cn, err := sqlite.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ModerncConnectorDSN(cn); !ok || got != dsn {
		t.Errorf("ModerncConnectorDSN = %q, %v; want %q, true", got, ok, dsn)
	}
	dc, err := cn.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if !BeginModerncImmediate(dc) {
		t.Fatal("BeginModerncImmediate could not set a modernc connection's begin mode")
	}
	if BeginModerncImmediate(dc) {
		t.Error("BeginModerncImmediate changed a begin mode that was already set")
	}
	if f, _ := moderncField(dc, "conn", "beginMode"); f.String() != "immediate" {
		t.Errorf("beginMode %q, want immediate", f.String())
	}
	// Anything else is left alone.
	if BeginModerncImmediate(nil) || BeginModerncImmediate(&otherConn{}) {
		t.Error("BeginModerncImmediate accepted a connection that is not modernc's")
	}
	if _, ok := ModerncConnectorDSN(&otherConnector{dsn: dsn}); ok {
		t.Error("ModerncConnectorDSN read another connector")
	}
}

// Another driver's connection and connector, as modernc's functions must
// leave them alone.
type (
	otherConn      struct{ beginMode string }
	otherConnector struct{ dsn string }
)
