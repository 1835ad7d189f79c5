package sqliteconn

import (
	"context"
	"database/sql/driver"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
	"modernc.org/sqlite"
)

// open opens a raw modernc connection to dsn and applies d to it.
func open(t *testing.T, d *Defaults, dsn string) driver.Conn {
	t.Helper()
	c, err := (&sqlite.Driver{}).Open(dsn)
	if err != nil {
		t.Fatalf("opening %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Apply(ctx, c); err != nil {
		t.Fatalf("Apply on %s: %v", dsn, err)
	}
	return c
}

// pragma reads a pragma's value, as a string.
func pragma(t *testing.T, c driver.Conn, name string) string {
	t.Helper()
	v, err := pragmaValue(context.Background(), c, "PRAGMA "+name)
	if err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return strings.ToLower(pgdriver.AsString(v))
}

// A DSN that sets nothing gets all three defaults; one that sets a pragma
// keeps its own; a read-only open and _txlock=exclusive stay out of WAL;
// a connector's connection (DSN unknown) only gets a busy timeout where it
// has none.
func TestApply(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, dsn           string
		fromConnector       bool
		journal, busy, fkey string
	}{
		{name: "nothing set", dsn: "file:" + filepath.Join(dir, "a.db"), journal: "wal", busy: "1234", fkey: "1"},
		{name: "its own pragmas", dsn: "file:" + filepath.Join(dir, "b.db") + "?_pragma=journal_mode(delete)&_pragma=busy_timeout(77)&_pragma=foreign_keys(0)",
			journal: "delete", busy: "77", fkey: "0"},
		{name: "txlock exclusive", dsn: "file:" + filepath.Join(dir, "c.db") + "?_txlock=exclusive", journal: "delete", busy: "1234", fkey: "1"},
		{name: "connector", dsn: "file:" + filepath.Join(dir, "d.db"), fromConnector: true, journal: "delete", busy: "1234", fkey: "0"},
		{name: "connector with a busy timeout", dsn: "file:" + filepath.Join(dir, "e.db") + "?_pragma=busy_timeout(55)", fromConnector: true, journal: "delete", busy: "55", fkey: "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dsn sqlitelock.DSN
			if !c.fromConnector {
				dsn = sqlitelock.ParseDSN(c.dsn)
			}
			conn := open(t, NewDefaults(dsn, !c.fromConnector, 1234*time.Millisecond), c.dsn)
			if got := pragma(t, conn, "journal_mode"); got != c.journal {
				t.Errorf("journal_mode = %s, want %s", got, c.journal)
			}
			if got := pragma(t, conn, "busy_timeout"); got != c.busy {
				t.Errorf("busy_timeout = %s, want %s", got, c.busy)
			}
			if got := pragma(t, conn, "foreign_keys"); got != c.fkey {
				t.Errorf("foreign_keys = %s, want %s", got, c.fkey)
			}
		})
	}
}

// A read-only open is never switched to WAL: the switch writes the file.
func TestApplyLeavesReadOnlyOpensAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ro.db")
	rw := "file:" + path + "?_pragma=journal_mode(delete)"
	w := open(t, NewDefaults(sqlitelock.ParseDSN(rw), true, time.Second), rw)
	if _, err := pragmaValue(context.Background(), w, "CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	ro := "file:" + path + "?mode=ro"
	if got := pragma(t, open(t, NewDefaults(sqlitelock.ParseDSN(ro), true, time.Second), ro), "journal_mode"); got != "delete" {
		t.Errorf("journal_mode of a read-only open = %s, want delete", got)
	}
}

// Connections opened together on a new file all switch it to WAL: their
// switches take turns instead of failing with SQLITE_BUSY.
func TestApplyManyAtOnce(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "many.db")
	d := NewDefaults(sqlitelock.ParseDSN(dsn), true, 5*time.Second)
	const n = 16
	conns := make([]driver.Conn, n)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := (&sqlite.Driver{}).Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, c := range conns {
		wg.Go(func() { errs[i] = d.Apply(ctx, c) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("connection %d: %v", i, err)
		} else if got := pragma(t, conns[i], "journal_mode"); got != "wal" {
			t.Errorf("connection %d: journal_mode = %s, want wal", i, got)
		}
	}
}
