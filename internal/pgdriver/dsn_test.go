package pgdriver

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"unicode"
)

func TestTarget(t *testing.T) {
	for _, c := range []struct{ dsn, host, port, db string }{
		{"postgres://u:secret@db.internal:5433/orders?sslmode=disable", "db.internal", "5433", "orders"},
		{"postgresql:///orders?host=/run/postgresql&port=5432", "/run/postgresql", "5432", "orders"},
		{"postgres://a:1,b:2/orders", "a:1,b:2", "", "orders"},
		{"host=db port=5432 dbname='my db' password='it\\'s'", "db", "5432", "my db"},
		{"user=u", "", "", ""},
		{"postgres://%zz", "", "", ""},
	} {
		host, port, db := Target(c.dsn)
		if host != c.host || port != c.port || db != c.db {
			t.Errorf("Target(%q) = %q, %q, %q; want %q, %q, %q", c.dsn, host, port, db, c.host, c.port, c.db)
		}
	}
}

type pgxLikeConfig struct {
	Host     string
	Port     uint16
	Database string
}

// driverConnector makes a driver.Connector of what embeds it.
type driverConnector struct{}

func (driverConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("not a driver")
}
func (driverConnector) Driver() driver.Driver { return nil }

type pgxLikeConnector struct {
	pgxLikeConfig
	driverConnector
}

func TestConnectorTarget(t *testing.T) {
	host, port, db := ConnectorTarget(&pgxLikeConnector{pgxLikeConfig: pgxLikeConfig{Host: "h", Port: 6432, Database: "d"}})
	if host != "h" || port != "6432" || db != "d" {
		t.Errorf("ConnectorTarget = %q, %q, %q", host, port, db)
	}
	if host, port, db := ConnectorTarget((*pgxLikeConnector)(nil)); host+port+db != "" {
		t.Errorf("a nil connector: %q, %q, %q", host, port, db)
	}
}

// quote writes v as a key=value DSN's quoted value.
func quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// KeyValues reads back every pair a DSN writes, quoted values with their
// escapes, and never fails on what it cannot read.
func FuzzKeyValues(f *testing.F) {
	f.Add("host", "db.internal", "dbname", "it's a 'db'")
	f.Add("a", "", "b", `\`)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		KeyValues(k1 + "=" + v1 + " " + k2 + v2) // anything: no panic
		for _, k := range []string{k1, k2} {
			// (a key is written bare: no '=', quote or space of any kind,
			// which the reader trims)
			if k == "" || strings.ContainsAny(k, "='") || strings.IndexFunc(k, unicode.IsSpace) >= 0 {
				return
			}
		}
		got := KeyValues(k1 + "=" + quote(v1) + " " + k2 + " = " + quote(v2))
		if len(got) != 2 || got[0] != [2]string{k1, v1} || got[1] != [2]string{k2, v2} {
			t.Fatalf("KeyValues read %q, want [%q %q] [%q %q]", got, k1, v1, k2, v2)
		}
	})
}
