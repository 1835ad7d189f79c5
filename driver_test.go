package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

func TestRegisterReturnsTheWrappedName(t *testing.T) {
	name, err := Register("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	if name != "lockhooks+sqlite" {
		t.Fatalf("Register returned %q", name)
	}
	again, err := Register("sqlite")
	if err != nil || again != name {
		t.Fatalf("a repeat Register without options = (%q, %v), want (%q, nil)", again, err, name)
	}
	db, err := sql.Open(name, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, ok := db.Driver().(*Driver); !ok {
		t.Fatalf("sql.Open(%q) uses %T, want *lockhooks.Driver", name, db.Driver())
	}
}

// Bad input gives a clear error, never a panic.
func TestBadInputIsAClearError(t *testing.T) {
	cases := []struct {
		name string
		err  func() error
		want string
	}{
		{"unknown driver name", func() error { _, err := Register("no-such-driver"); return err }, `no database/sql driver is registered as "no-such-driver"`},
		{"Open with unknown driver", func() error { _, err := Open("no-such-driver", ""); return err }, `no database/sql driver is registered`},
		{"wrapping a wrapper", func() error { _, err := Register("lockhooks+sqlite"); return err }, "already a lockhooks driver"},
		{"repeat Register with options", func() error {
			if _, err := Register("sqlite"); err != nil {
				return err
			}
			_, err := Register("sqlite", WithDialect(SQLite))
			return err
		}, "first options stay in force"},
		{"nil driver", func() error {
			db := sql.OpenDB(mustConnector(t, Wrap(nil)))
			defer db.Close()
			return db.Ping()
		}, "nil driver.Driver"},
		{"nil connector", func() error { return OpenDB(nil).Ping() }, "nil driver.Connector"},
		{"Open of a lockhooks+ name", func() error {
			if _, err := Register("sqlite"); err != nil {
				return err
			}
			_, err := Open("lockhooks+sqlite", ":memory:")
			return err
		}, `"lockhooks+sqlite" is already wrapped by lockhooks (lockhooks.Register made it): open it with sql.Open("lockhooks+sqlite", dsn), or call lockhooks.Open with "sqlite"`},
		{"Wrap of a wrapped driver", func() error {
			db := sql.OpenDB(mustConnector(t, Wrap(Wrap(&sqlite.Driver{}))))
			defer db.Close()
			return db.Ping()
		}, "a driver lockhooks already wrapped"},
		{"OpenDB of a wrapped connector", func() error {
			c, err := Wrap(&sqlite.Driver{}).(driver.DriverContext).OpenConnector(":memory:")
			if err != nil {
				return err
			}
			db := OpenDB(c)
			defer db.Close()
			return db.Ping()
		}, "a connector lockhooks already wrapped"},
		{"unknown dialect", func() error {
			return OpenDB(fakeConnector{drv: fakeDriver{conn: func() driver.Conn { return newFakeConn() }}}).Ping()
		}, "pass lockhooks.WithDialect"},
		{"unsupported dialect", func() error { _, err := Open("sqlite", ":memory:", WithDialect("mysql")); return err }, `"mysql" is not supported`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	err := OpenDB(fakeConnector{drv: fakeDriver{}}).Ping()
	if !errors.Is(err, ErrUnknownDialect) {
		t.Errorf("unknown dialect error %v does not wrap ErrUnknownDialect", err)
	}
}

// mustConnector opens a connector from a driver that implements
// DriverContext, failing t if it does not.
func mustConnector(t *testing.T, d driver.Driver) driver.Connector {
	t.Helper()
	return lazyConnector{d: d.(driver.DriverContext)}
}

// lazyConnector defers OpenConnector to Connect, to see its error there.
type lazyConnector struct{ d driver.DriverContext }

func (l lazyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := l.d.OpenConnector("")
	if err != nil {
		return nil, err
	}
	return c.Connect(ctx)
}
func (l lazyConnector) Driver() driver.Driver { return l.d.(driver.Driver) }

func TestDialectIsInferredFromTheInnerDriver(t *testing.T) {
	for _, c := range []struct {
		v    any
		want Dialect
	}{
		{&stdlib.Driver{}, Postgres},
		{stdlib.GetDefaultDriver(), Postgres},
		{&sqlite.Driver{}, SQLite},
	} {
		got, ok := inferDialect(c.v)
		if !ok || got != c.want {
			t.Errorf("inferDialect(%T) = %q, %v; want %q", c.v, got, ok, c.want)
		}
	}
	if _, ok := inferDialect(fakeDriver{}); ok {
		t.Error("a fake driver was given a dialect")
	}
	lite, err := sqlite.NewConnector(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	if c := WrapConnector(lite); c.(*connector).opts.dialect != SQLite {
		t.Errorf("modernc connector: dialect %q", c.(*connector).opts.dialect)
	}
}

// The root package must work with any driver, so it imports neither pgx nor
// modernc.org/sqlite.
func TestRootPackageImportsNoDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/jackc/") || strings.HasPrefix(dep, "modernc.org/") {
			t.Errorf("the lockhooks package depends on %s", dep)
		}
	}
}

// The wrapped connector forwards io.Closer: sql.DB.Close closes the inner
// connector.
func TestConnectorCloseReachesTheInnerConnector(t *testing.T) {
	inner := &closingConnector{fakeConnector: fakeConnector{drv: fakeDriver{conn: func() driver.Conn { return newFakeConn() }}}}
	db := OpenDB(inner, WithDialect(SQLite))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !inner.closed {
		t.Error("db.Close did not close the inner connector")
	}
}

type closingConnector struct {
	fakeConnector
	closed bool
}

func (c *closingConnector) Close() error { c.closed = true; return nil }
