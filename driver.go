// Package lockhooks wraps a database/sql driver for PostgreSQL or SQLite so
// that database locking is correct, visible and fast.
//
// A user changes one driver name:
//
//	name, err := lockhooks.Register("pgx") // "lockhooks+pgx"
//	db, err := sql.Open(name, dsn)
//
// or wraps a connector:
//
//	db := lockhooks.OpenDB(stdlib.GetConnector(cfg))
//
// The root package imports neither pgx nor modernc.org/sqlite; it works with
// any Postgres or SQLite driver and infers which of the two it talks to from
// the inner driver's package (see [WithDialect]).
package lockhooks

//go:generate go run ./internal/ifacegen

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lockhooks/lockhooks/internal/advisorylock"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/driverext"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/inprocess"
	"github.com/lockhooks/lockhooks/internal/lockdb"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/sqliteconn"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Dialect names the SQL dialect of the wrapped database.
type Dialect string

// The dialects lockhooks understands.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// Prefix is prepended to a driver's name by [Register].
const Prefix = "lockhooks+"

// ErrUnknownDialect is returned when the dialect is neither given with
// [WithDialect] nor recognisable from the inner driver's package.
var ErrUnknownDialect = errors.New("lockhooks: unknown SQL dialect")

// Driver is a wrapped driver.Driver. It implements driver.DriverContext, so
// every *sql.DB opened by name gets its own connector and lock state.
//
// The driver-level optional interfaces of the inner driver that name a
// driver's own types are forwarded by a subpackage, imported for its side
// effect: github.com/lockhooks/lockhooks/modernc forwards modernc's
// vtab.ModuleRegisterer, so vtab.RegisterModule(db, …) registers on the
// wrapped driver. Wrap then returns a value that embeds *Driver and has
// such an interface exactly when the inner driver has it.
type Driver struct {
	inner driver.Driver
	opts  []Option
	self  driver.Driver // what Wrap returned: d, or d with forwarded interfaces
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.DriverContext = (*Driver)(nil)
)

// Wrap returns a driver that opens connections through d with lockhooks'
// locking behaviour. Errors in d or opts (a nil driver, an unknown dialect)
// are returned when the first connector or connection is opened.
func Wrap(d driver.Driver, opts ...Option) driver.Driver {
	return newDriver(d, opts).self
}

// newDriver wraps d and decides which of d's driver-level optional
// interfaces the wrapper shows (see [Driver]).
func newDriver(d driver.Driver, opts []Option) *Driver {
	w := &Driver{inner: d, opts: opts}
	w.self = w
	if d != nil {
		w.self = driverext.Decorate(w, d)
	}
	return w
}

// lockhooksDriver returns d; a value that embeds *Driver to forward an
// optional interface is recognised by it.
func (d *Driver) lockhooksDriver() *Driver { return d }

// asDriver returns the *Driver of a value Wrap returned.
func asDriver(v driver.Driver) (*Driver, bool) {
	if w, ok := v.(interface{ lockhooksDriver() *Driver }); ok {
		return w.lockhooksDriver(), true
	}
	return nil, false
}

// Open opens one connection; database/sql prefers OpenConnector.
func (d *Driver) Open(dsn string) (driver.Conn, error) {
	c, err := d.OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	// A connector of its own that nobody closes: it must not stay in the
	// process's registry of databases.
	databases.Leave(c.(*connector))
	return c.Connect(context.Background())
}

// OpenConnector returns a connector for dsn that shares lock state between
// all of its connections.
func (d *Driver) OpenConnector(dsn string) (driver.Connector, error) {
	if d.inner == nil {
		return nil, errors.New("lockhooks: Wrap was given a nil driver.Driver")
	}
	if _, ok := asDriver(d.inner); ok {
		return nil, errors.New("lockhooks: Wrap was given a driver lockhooks already wrapped; use it as it is, or wrap the inner driver")
	}
	o, err := resolveOptions(d.opts, d.inner)
	if err != nil {
		return nil, err
	}
	var sqlite sqlitelock.DSN
	if o.dialect == SQLite {
		sqlite = sqlitelock.ParseDSN(dsn)
		sqlite.PlanModerncBegin(packageOf(d.inner))
	}
	// The inner driver gets the DSN exactly as the user wrote it.
	var inner driver.Connector
	if dc, ok := d.inner.(driver.DriverContext); ok {
		c, err := dc.OpenConnector(dsn)
		if err != nil {
			return nil, err
		}
		inner = c
	} else {
		inner = dsnConnector{dsn: dsn, driver: d.inner}
	}
	c := newConnector(inner, d, o, dsn, sqlite)
	return c, nil
}

// Unwrap returns the wrapped driver.
func (d *Driver) Unwrap() driver.Driver { return d.inner }

// dsnConnector adapts a driver without DriverContext, as database/sql does.
type dsnConnector struct {
	dsn    string
	driver driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.driver.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.driver }

// WrapConnector returns a connector whose connections have lockhooks'
// locking behaviour. Use it with sql.OpenDB when the inner driver is
// configured through a connector (pgx's stdlib.GetConnector,
// modernc's sqlite.NewConnector). Errors in c or opts are returned by the
// first Connect.
func WrapConnector(c driver.Connector, opts ...Option) driver.Connector {
	if c == nil {
		return brokenConnector{err: errors.New("lockhooks: WrapConnector was given a nil driver.Connector")}
	}
	if _, ok := c.(*connector); ok {
		return brokenConnector{err: errors.New("lockhooks: WrapConnector was given a connector lockhooks already wrapped; use it as it is, or wrap the inner connector"), drv: c.Driver()}
	}
	o, err := resolveOptions(opts, c.Driver(), c)
	if err != nil {
		return brokenConnector{err: err, drv: c.Driver()}
	}
	var sqlite sqlitelock.DSN
	if o.dialect == SQLite {
		// The connector's DSN is not lockhooks' to read, except that a
		// modernc connector's _txlock must not be weakened, its
		// read-only open must begin transactions as the driver does, and
		// without _txlock modernc can begin lockhooks' IMMEDIATE itself.
		if dsn, ok := sqlitelock.ModerncConnectorDSN(c); ok {
			d := sqlitelock.ParseDSN(dsn)
			d.PlanModerncBegin(packageOf(c))
			sqlite.TxLock, sqlite.ReadOnly = d.TxLock, d.ReadOnly
			sqlite.DriverBegins, sqlite.SetBeginMode = d.DriverBegins, d.SetBeginMode
		}
	}
	return newConnector(c, newDriver(c.Driver(), opts), o, "", sqlite)
}

// brokenConnector reports a configuration error on every Connect, the way
// sql.OpenDB reports connector errors: at first use.
type brokenConnector struct {
	err error
	drv driver.Driver
}

func (b brokenConnector) Connect(context.Context) (driver.Conn, error) { return nil, b.err }
func (b brokenConnector) Driver() driver.Driver                        { return newDriver(b.drv, nil).self }

// OpenDB is sql.OpenDB(WrapConnector(c, opts...)).
func OpenDB(c driver.Connector, opts ...Option) *sql.DB {
	w := WrapConnector(c, opts...)
	db := sql.OpenDB(w)
	if lc, ok := w.(*connector); ok {
		lc.noteDB(db)
	}
	return db
}

// Open opens a database through the registered driver driverName (for
// example "pgx" or "sqlite") with lockhooks' locking behaviour, without
// registering a new name. Unlike sql.Open it checks the options at once.
func Open(driverName, dsn string, opts ...Option) (*sql.DB, error) {
	inner, err := registeredDriver(driverName)
	if err != nil {
		return nil, err
	}
	if _, ok := asDriver(inner); ok {
		name := "the inner driver's name"
		if strings.HasPrefix(driverName, Prefix) {
			name = strconv.Quote(strings.TrimPrefix(driverName, Prefix))
		}
		return nil, fmt.Errorf("lockhooks: %q is already wrapped by lockhooks (lockhooks.Register made it): open it with sql.Open(%q, dsn), or call lockhooks.Open with %s", driverName, driverName, name)
	}
	c, err := newDriver(inner, opts).OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	if lc, ok := c.(*connector); ok {
		lc.noteDB(db)
	}
	return db, nil
}

// registerMu makes the check-then-register in Register atomic: sql.Register
// panics on a duplicate name.
var registerMu sync.Mutex

// Register registers the driver registered as driverName again, wrapped, as
// "lockhooks+"+driverName, and returns that name for sql.Open. Registering
// the same driver again without options returns the name and no error; a
// repeat with options is an error, because the first registration's options
// stay in force.
func Register(driverName string, opts ...Option) (string, error) {
	if strings.HasPrefix(driverName, Prefix) {
		return "", fmt.Errorf("lockhooks: %q is already a lockhooks driver; register the inner driver's name instead", driverName)
	}
	inner, err := registeredDriver(driverName)
	if err != nil {
		return "", err
	}
	if _, err := resolveOptions(opts, inner); err != nil {
		return "", err
	}
	name := Prefix + driverName

	registerMu.Lock()
	defer registerMu.Unlock()
	if existing, err := registeredDriver(name); err == nil {
		w, ok := asDriver(existing)
		switch {
		case !ok || w.inner != inner:
			return "", fmt.Errorf("lockhooks: the driver name %q is already taken by %s", name, describe(existing))
		case len(opts) > 0:
			return name, fmt.Errorf("lockhooks: %q is already registered; its first options stay in force (use lockhooks.Open or OpenDB for different options)", name)
		}
		return name, nil
	}
	sql.Register(name, Wrap(inner, opts...))
	return name, nil
}

// registeredDriver returns the driver registered as name. sql.Open does not
// connect, so this only looks the name up.
func registeredDriver(name string) (driver.Driver, error) {
	if !slices.Contains(sql.Drivers(), name) {
		return nil, fmt.Errorf("lockhooks: no database/sql driver is registered as %q (is its package imported?); registered: %s",
			name, strings.Join(sql.Drivers(), ", "))
	}
	db, err := sql.Open(name, "")
	if err != nil {
		return nil, fmt.Errorf("lockhooks: cannot look up the driver registered as %q: %w", name, err)
	}
	d := db.Driver()
	_ = db.Close()
	return d, nil
}

// connector is the wrapped connector: the state of one wrapped database,
// shared by all of its connections.
type connector struct {
	// DB is the database as the core sees it (internal/lockdb): its pool
	// name, open connections, lock tables, waits, events, session-lock
	// registry and reader of who blocks whom.
	lockdb.DB[*conn, lockKey]

	inner    driver.Connector
	driver   *Driver
	opts     *options
	rewriter *rewriter
	tel      *reporting
	pins     *pinning               // Postgres only
	stmts    statements             // what the statements on the slow path share (internal/pgstmt)
	advisory advisorylock.Database  // what its AdvisoryLocks share (internal/advisorylock)
	tokens   advisorylock.Clock     // SQLite: the in-process advisory locks' fencing tokens
	own      pgdriver.Statements    // Postgres: what the driver allows lockhooks' own statements (pg_begin.go)
	sites    callsite.Names         // Postgres: call sites of transactions' identities, by return address (internal/callsite)
	writer   writerLock             // SQLite's in-process writer lock
	defaults *sqliteconn.Defaults   // SQLite: what a new connection gets where the DSN leaves it unset
	dsn      string                 // "" when the inner connector was given
	seq      uint64                 // the database's number in the process, from 1 (identities name it: internal/identity)
	server   atomic.Pointer[string] // Postgres: the server its connections reached (its start time, read by identifyOnConnect; nil: not known)
	sqlDB    atomic.Pointer[sql.DB] // the database that uses it, once known (noteDB): its pool's counts tell a deadlocked pool
	sqlite   sqlitelock.DSN         // dsn's parameters, parsed (SQLite)
	nextID   atomic.Uint64
	side     *rawconn.Side // Postgres: the one connection outside the pool for lookups (pg_blockers.go)
}

var (
	_ driver.Connector = (*connector)(nil)
	_ io.Closer        = (*connector)(nil)
)

// newConnector returns the state of one wrapped database, registered in
// the process's registry of databases (which also settles its pool name)
// until Close.
func newConnector(inner driver.Connector, d *Driver, o *options, dsn string, sqlite sqlitelock.DSN) *connector {
	c := &connector{inner: inner, driver: d, opts: o, rewriter: newRewriter(o), dsn: dsn, sqlite: sqlite}
	c.Dialect, c.Names, c.Writer = string(o.dialect), &keyNames, &c.writer.core
	c.advisory.CheckTimeout, c.advisory.Logger, c.advisory.Names = o.lockCheckTimeout, o.logger, &keyNames
	c.OwnerConn, c.NeedsConn, c.Identify = ownerConn, needsConn, identify
	c.openSide() // before join: a database the registry lists can be asked who a backend is
	databases.join(c, defaultPoolName(o.dialect, dsn, inner))
	var observe func() (held, parked int64)
	if o.dialect == SQLite {
		c.defaults = sqliteconn.NewDefaults(sqlite, dsn != "", o.busyTimeout)
	}
	if o.dialect == Postgres {
		c.pins = newPinning(c)
		c.Sessions, observe = c.pins.Registry, c.pins.Observe
	}
	c.tel = newReporting(o, c.Pool, observe)
	c.Events = holders.NewEvents(eventCapacity)
	c.Waits = newWaitWatch(c) // (after c.Events: the slow waits are among its events)
	c.tel.events, c.tel.watch = c.Events, c.Waits
	c.stmts = statements{DB: &c.DB, Telemetry: c.tel.Set, Outcomes: outcomes(),
		Taker:       func(ctx context.Context, owner any) inprocess.Taker { return takerOf(ctx, owner, nil) },
		ExplainWait: explainTableWait, Others: deadlockOthers}
	if c.pins != nil {
		c.stmts.Guard, c.stmts.Reroute = &c.pins.guard, c.pins.rerouteUnlock
	}
	return c
}

// Connect opens and wraps one physical connection.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	inner, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if c.opts.dialect == SQLite {
		if err := c.defaults.Apply(ctx, inner); err != nil {
			inner.Close()
			return nil, err
		}
	}
	wrapped := newConn(c, inner)
	w := wrapped.(connCore).state()
	w.driverBegins = c.sqlite.DriverBegins
	if c.sqlite.SetBeginMode {
		w.driverBegins = sqlitelock.BeginModerncImmediate(inner)
	}
	if c.pins != nil {
		// The backend pid names the connection in pg_locks for the
		// tracking, the monitor and the messages; the same read tells
		// whether the user named the application (pg_identity_publish.go).
		if err := w.identifyOnConnect(ctx); err != nil {
			inner.Close()
			return nil, err
		}
	}
	c.Opened(w)
	return wrapped, nil
}

// Driver returns the wrapped driver, as sql.DB.Driver reports it: the value
// Wrap returned, with the inner driver's forwarded optional interfaces.
func (c *connector) Driver() driver.Driver {
	if c.driver.self != nil {
		return c.driver.self
	}
	return c.driver
}

// Close is called by sql.DB.Close. Connections parked because they hold
// session advisory locks are closed, which releases the locks (each is
// logged); then the inner connector is closed when it is an io.Closer.
func (c *connector) Close() error {
	databases.Leave(c)
	if c.pins != nil {
		c.pins.Close()
	}
	c.tel.Close()
	c.Waits.Close()
	c.side.Close()
	if cl, ok := c.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}
