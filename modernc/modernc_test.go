package modernc_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
	"modernc.org/sqlite/vtab"

	"github.com/lockhooks/lockhooks"
	_ "github.com/lockhooks/lockhooks/modernc"
)

// reachModule reports that SQLite reached it by failing Create.
type reachModule struct{ tag string }

func (m reachModule) Create(vtab.Context, []string) (vtab.Table, error) {
	return nil, errors.New("reached:" + m.tag)
}

func (m reachModule) Connect(vtab.Context, []string) (vtab.Table, error) {
	return nil, errors.New("reached:" + m.tag)
}

var seq atomic.Int64

// ownDriver registers a modernc driver of its own under a fresh name.
func ownDriver(t *testing.T) (name string, d *sqlite.Driver) {
	t.Helper()
	d = &sqlite.Driver{}
	name = "issue11-mine-" + string(rune('a'+seq.Add(1)))
	sql.Register(name, d)
	return name, d
}

// ownConnector opens connections through a driver of its own.
type ownConnector struct {
	d   *sqlite.Driver
	dsn string
}

func (c ownConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c ownConnector) Driver() driver.Driver                        { return c.d }

// createVirtual reports what CREATE VIRTUAL TABLE with module mod says.
func createVirtual(t *testing.T, db *sql.DB, mod string) string {
	t.Helper()
	_, err := db.Exec("CREATE VIRTUAL TABLE v USING " + mod + "()")
	if err == nil {
		t.Fatalf("CREATE VIRTUAL TABLE USING %s succeeded", mod)
	}
	return err.Error()
}

// vtab.RegisterModule(db, …) on a database opened through lockhooks with a
// modernc driver of one's own registers on that driver, as without
// lockhooks, not process-wide; through Register, Open and OpenDB.
func TestRegisterModuleReachesTheWrappedDriver(t *testing.T) {
	open := map[string]func(t *testing.T, dsn string) *sql.DB{
		"Register": func(t *testing.T, dsn string) *sql.DB {
			inner, _ := ownDriver(t)
			name, err := lockhooks.Register(inner)
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open(name, dsn)
			if err != nil {
				t.Fatal(err)
			}
			return db
		},
		"Open": func(t *testing.T, dsn string) *sql.DB {
			inner, _ := ownDriver(t)
			db, err := lockhooks.Open(inner, dsn)
			if err != nil {
				t.Fatal(err)
			}
			return db
		},
		"OpenDB": func(t *testing.T, dsn string) *sql.DB {
			_, d := ownDriver(t)
			return lockhooks.OpenDB(ownConnector{d: d, dsn: dsn})
		},
	}
	for how, open := range open {
		t.Run(how, func(t *testing.T) {
			db := open(t, filepath.Join(t.TempDir(), "vtab.db"))
			defer db.Close()
			if _, ok := db.Driver().(vtab.ModuleRegisterer); !ok {
				t.Fatalf("db.Driver() (%T) hides the inner driver's vtab.ModuleRegisterer", db.Driver())
			}
			mod := "issue11_" + strings.ToLower(how)
			if err := vtab.RegisterModule(db, mod, reachModule{how}); err != nil {
				t.Fatal(err)
			}
			if msg := createVirtual(t, db, mod); !strings.Contains(msg, "reached:"+how) {
				t.Errorf("the module registered through db is not on its driver: %s", msg)
			}
			// It is on that driver alone: the package-level driver lacks it.
			raw, err := sql.Open("sqlite", ":memory:")
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			if msg := createVirtual(t, raw, mod); !strings.Contains(msg, "no such module") {
				t.Errorf("the module leaked to the package-level driver: %s", msg)
			}
		})
	}
}

// A wrapped driver has a driver-level optional interface exactly when the
// inner driver has it, over the interfaces modernc and pgx expose. The one
// deliberate exception is driver.DriverContext: lockhooks needs a connector
// per database, so the wrapper always has it.
func TestWrappedDriverExposesExactlyTheInnerInterfaces(t *testing.T) {
	optional := []reflect.Type{reflect.TypeFor[vtab.ModuleRegisterer]()}
	registered := func(name string) driver.Driver {
		db, err := sql.Open(name, "")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		return db.Driver()
	}
	for _, inner := range []driver.Driver{&sqlite.Driver{}, registered("sqlite"), stdlib.GetDefaultDriver(), noContextDriver{}} {
		w := lockhooks.Wrap(inner, lockhooks.WithDialect(lockhooks.SQLite))
		for _, it := range optional {
			if got, want := reflect.TypeOf(w).Implements(it), reflect.TypeOf(inner).Implements(it); got != want {
				t.Errorf("%T: the wrapper implements %v: %v, the inner driver: %v", inner, it, got, want)
			}
		}
		if _, ok := w.(driver.DriverContext); !ok {
			t.Errorf("%T: the wrapper lacks driver.DriverContext", inner)
		}
		if u, ok := w.(interface{ Unwrap() driver.Driver }); !ok || u.Unwrap() != inner {
			t.Errorf("%T: Unwrap does not return the inner driver", inner)
		}
		// The connector reports the same forwarding as the driver.
		c, err := w.(driver.DriverContext).OpenConnector(":memory:")
		if err != nil {
			if _, isPgx := inner.(*stdlib.Driver); !isPgx {
				t.Fatalf("%T: OpenConnector: %v", inner, err)
			}
			continue // pgx parses the DSN at OpenConnector
		}
		if c.Driver() != w {
			t.Errorf("%T: the connector's Driver() is %T, not what Wrap returned", inner, c.Driver())
		}
	}
}

// noContextDriver is a driver with no optional interface.
type noContextDriver struct{}

func (noContextDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not for use") }
