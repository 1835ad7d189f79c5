package lockhooks

import (
	"context"
	"database/sql/driver"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
)

// connCore is what every wrapped connection implements, whatever the inner
// connection offers. Validator is the one deliberate addition: the wrapper
// must see each return of the connection to the pool.
type connCore interface {
	driver.Conn
	driver.Validator
	Unwrap() driver.Conn
	// state returns the wrapper's own connection, for code that holds the
	// value database/sql holds (sql.Conn.Raw).
	state() *conn
}

// probeTimeout bounds the liveness check IsValid makes after a failure.
const probeTimeout = 2 * time.Second

// conn is one wrapped physical connection and the state lockhooks keeps
// for it from Connect to Close. database/sql uses a connection from one
// goroutine at a time; fields that other goroutines may read are atomic.
type conn struct {
	connector *connector
	inner     driver.Conn
	id        uint64

	// The inner connection's optional interfaces, nil where absent.
	// execer and queryer are also set from the legacy Execer and Queryer.
	execer    driver.ExecerContext
	queryer   driver.QueryerContext
	preparer  driver.ConnPrepareContext
	beginner  driver.ConnBeginTx
	pinger    driver.Pinger
	resetter  driver.SessionResetter
	checker   driver.NamedValueChecker
	validator driver.Validator

	// suspect is set when an inner call failed with an error that did not
	// come from the database server, so the connection may be broken.
	suspect atomic.Bool

	// direct: the connection reaches the server itself, no pooler between
	// (the process id the server sent at connect is pg_backend_pid()'s,
	// which a pooler's is not; pgx only, no pooler declared, and not in
	// the simple protocol the user chose). Its statements then run on
	// pin.PID's backend, always: an exact session-lock statement needs no
	// pg_locks read after it (see pgsession.Conn.LockText).
	direct bool
	// sentArgs holds the arguments of a statement lockhooks annotated
	// (sentWith).
	sentArgs []driver.NamedValue
	// sentTexts are the connection's last annotated statement texts, in a
	// ring (sentWith).
	sentTexts [8]string
	sentNext  int

	// tx is the connection's transaction; database/sql runs at most one
	// per connection at a time, so BeginTx hands out a pointer to it.
	tx tx

	// pin is the connection's session-lock tracking (Postgres): its
	// advisory locks, the backend it reached (PID, Incarnation,
	// ReachesServer; PID is 0 until the connection opens, and on SQLite),
	// its round trips, its transaction-pooler holder and its identity as
	// other processes see it (Who).
	pin pgsession.Conn[lockKey]

	// order is the lock-order checker's state for the connection.
	order stmtlocks.Session

	// driverBegins is set on SQLite when the inner connection's own
	// BeginTx begins write transactions as lockhooks must (see
	// sqlitelock.DSN.PlanModerncBegin), so lockhooks does not run BEGIN and COMMIT itself.
	driverBegins bool

	// ident is the open transaction as other goroutines see it (Postgres):
	// a holder's identity in the model of holders (internal/holding).
	ident holding.Tx

	// selfRun is RunInTx's fn whose transaction the connection runs, if
	// any, read by other connections' waiters (Run, holding.SelfWait).
	selfRun atomic.Pointer[callsite.Run]

	// advisory is the AdvisoryLock held on this connection, if any: a loss
	// frees its in-process turn at once.
	advisory atomic.Pointer[AdvisoryLock]
	// acquiring is set while AcquireAdvisoryLock or TryAdvisoryLock takes
	// a lock on this connection, from its lock statement to its last
	// statement (the token read): the lock statement takes no turn (the
	// acquisition owns the key's turn already: internal/pgstmt's turns.go), and the
	// monitor's first look waits for the acquisition to settle
	// (pinning.acquired).
	acquiring atomic.Bool

	// mark is the marker the connection leaves on its backend (Postgres:
	// at connect, pgsession.Conn.Identify, or where that read could not
	// run, pgsession.Conn.ReadPID), set before its first statement.
	mark string
}

var _ connCore = (*conn)(nil)

// Interface bits of withConnInterfaces, in generated order.
const (
	connExecerContext uint = 1 << iota
	connQueryerContext
	connPrepareContext
	connBeginTx
	connPinger
	connSessionResetter
	connNamedValueChecker
)

// newConn wraps inner and returns it with exactly the optional interfaces
// inner has (legacy Execer/Queryer count as their context forms).
func newConn(c *connector, inner driver.Conn) driver.Conn {
	w := &conn{connector: c, inner: inner, id: c.nextID.Add(1)}
	w.tx.c = w
	if c.pins != nil {
		w.pin.Who = pgsession.NewIdentity(c.seq, c.Pool, w.id)
		w.pin.Init(c.pins.Settings(), w)
		w.pin.Hold.Init(&c.pins.holders, w)
	}
	var mask uint
	if e, ok := inner.(driver.ExecerContext); ok {
		w.execer = e
	} else if e, ok := inner.(driver.Execer); ok { //nolint:staticcheck // legacy drivers
		w.execer = rawconn.LegacyExecer{Execer: e}
	}
	if w.execer != nil {
		mask |= connExecerContext
	}
	if q, ok := inner.(driver.QueryerContext); ok {
		w.queryer = q
	} else if q, ok := inner.(driver.Queryer); ok { //nolint:staticcheck // legacy drivers
		w.queryer = rawconn.LegacyQueryer{Queryer: q}
	}
	if w.queryer != nil {
		mask |= connQueryerContext
	}
	if p, ok := inner.(driver.ConnPrepareContext); ok {
		w.preparer = p
		mask |= connPrepareContext
	}
	if b, ok := inner.(driver.ConnBeginTx); ok {
		w.beginner = b
		mask |= connBeginTx
	}
	if p, ok := inner.(driver.Pinger); ok {
		w.pinger = p
		mask |= connPinger
	}
	if r, ok := inner.(driver.SessionResetter); ok {
		w.resetter = r
		mask |= connSessionResetter
	}
	if n, ok := inner.(driver.NamedValueChecker); ok {
		w.checker = n
		mask |= connNamedValueChecker
	}
	w.validator, _ = inner.(driver.Validator)
	return withConnInterfaces(w, mask)
}

// Unwrap returns the inner driver connection, for sql.Conn.Raw users:
//
//	conn.Raw(func(dc any) error {
//		inner := dc.(interface{ Unwrap() driver.Conn }).Unwrap()
//		...
//	})
//
// Calls on the inner connection bypass lockhooks: no rewrite, no lock
// tracking and, on SQLite, no writer lock, so a call that writes can meet
// SQLITE_BUSY from lockhooks' writers of the same database, or make them
// wait. On modernc.org/sqlite these write: Exec, Query and prepared
// statements that write, Begin/BeginTx (a deferred BEGIN, or IMMEDIATE when
// lockhooks told modernc to, see sqlitelock.DSN.PlanModerncBegin: a transaction that only
// reads should pass ReadOnly, which begins deferred), NewRestore (its
// Step overwrites this database) and Deserialize (this connection's
// database becomes an in-memory image; return driver.ErrBadConn from Raw
// so the connection is closed). Serialize, NewBackup (it writes only its
// destination), IsReadOnly, Status and the FileControl and hook calls do
// not write.
func (c *conn) Unwrap() driver.Conn { return c.inner }

func (c *conn) state() *conn { return c }

// String names the connection in errors and logs as the model of holders
// does: `connection #3 of "orders" (backend pid 812)`.
func (c *conn) String() string { return connHolder(c).Who() }

// ExecContext runs query through the statement hooks.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.connector.tel.StatementSpans() {
		ctx, span := c.connector.tel.statementSpan(ctx, query)
		res, err := c.exec(ctx, query, args)
		endStatementSpan(span, err)
		return res, err
	}
	return c.exec(ctx, query, args)
}

// exec is ExecContext without the statement span.
func (c *conn) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if query == lockMarker {
		return c.lockset(ctx, args)
	}
	st := c.intercept(ctx, query)
	c.beforeStatement(st, query, args)
	if c.needsWriterLock(st) {
		if err := c.connector.writer.lock(ctx, c.connector.tel, c, c.connector.opts.busyTimeout, query); err != nil {
			return nil, err
		}
		defer c.connector.writer.unlock()
	}
	if st.advisory != nil || st.rowLock || c.pin.Active.Load() {
		return c.execTracked(ctx, st, args, true, func(text string, args []driver.NamedValue) (driver.Result, error) {
			return c.execer.ExecContext(ctx, text, args)
		})
	}
	res, err := c.execer.ExecContext(ctx, st.text, args)
	return res, st.explain(c.Observe(err))
}

// QueryContext runs query through the statement hooks.
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	var (
		rows driver.Rows
		err  error
	)
	if c.connector.tel.StatementSpans() {
		ctx, span := c.connector.tel.statementSpan(ctx, query)
		rows, err = c.query(ctx, query, args)
		endStatementSpan(span, err)
	} else {
		rows, err = c.query(ctx, query, args)
	}
	if err == nil && c.connector.opts.lockOrder != nil {
		rows = c.watchRowLock(ctx, query, rows)
	}
	return rows, err
}

// query is QueryContext without the statement span.
func (c *conn) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	st := c.intercept(ctx, query)
	c.beforeStatement(st, query, args)
	if c.needsWriterLock(st) {
		return c.queryWriting(ctx, st, query, func() (driver.Rows, error) { return c.queryer.QueryContext(ctx, st.text, args) })
	}
	if st.advisory != nil || st.rowLock || c.pin.Active.Load() {
		return c.queryTracked(ctx, st, args, true, func(text string, args []driver.NamedValue) (driver.Rows, error) {
			return c.queryer.QueryContext(ctx, text, args)
		})
	}
	rows, err := c.queryer.QueryContext(ctx, st.text, args)
	return rows, st.explain(c.Observe(err))
}

// Prepare prepares query (rewritten by the statement hooks) on the inner
// connection; database/sql calls it only when PrepareContext is absent.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares the rewritten query; executions of the statement
// go through the same hooks.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if query == lockMarker {
		return markerStmt{c}, nil
	}
	st := c.intercept(ctx, query)
	var (
		inner driver.Stmt
		err   error
	)
	if c.preparer != nil {
		inner, err = c.preparer.PrepareContext(ctx, st.text)
	} else {
		inner, err = c.inner.Prepare(st.text)
	}
	if err != nil {
		return nil, st.explain(c.Observe(err))
	}
	return newStmt(c, inner, query, st), nil
}

// Begin starts a transaction; database/sql calls it only when BeginTx is
// absent.
func (c *conn) Begin() (driver.Tx, error) {
	if c.beginsImmediate(driver.TxOptions{}) {
		return c.beginImmediate(context.Background(), driver.TxOptions{})
	}
	var site *callsite.Stack
	if c.connector.pins != nil {
		site = new(callsite.Stack)
		site.CaptureFast()
	}
	inner, err := c.inner.Begin() //nolint:staticcheck // the inner driver has no BeginTx
	if err != nil {
		return nil, c.Observe(err)
	}
	return c.tx.begin(context.Background(), inner, driver.TxOptions{}, site), nil
}

// BeginTx starts a transaction. On SQLite a transaction that may write
// (ReadOnly false) first takes the in-process writer lock, then runs
// BEGIN IMMEDIATE, so it never meets SQLITE_BUSY from this process. On
// Postgres lockhooks sends the BEGIN itself where its round trip has
// something to carry (pg_begin.go).
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.beginsImmediate(opts) {
		return c.beginImmediate(ctx, opts)
	}
	if c.connector.pins == nil {
		inner, err := c.beginner.BeginTx(ctx, opts)
		if err != nil {
			return nil, c.Observe(err)
		}
		return c.tx.begin(ctx, inner, opts, nil), nil
	}
	// Postgres: where the transaction begins, which waiters of other
	// connections are told, here and in other processes (a frame-pointer
	// walk of a few nanoseconds on amd64 and arm64).
	var site callsite.Stack
	site.CaptureFast()
	if t, ok, err := c.beginOwn(ctx, opts, &site); ok {
		return t, err
	}
	// pgx runs COMMIT and ROLLBACK with this context, and closes the
	// connection when they fail: a cancelled context would take every
	// session lock of the connection with it. database/sql still rolls back
	// when ctx ends, and statements still honour their own context.
	var inner driver.Tx
	err := c.noteRoundTrip("", func() (err error) {
		inner, err = c.beginner.BeginTx(context.WithoutCancel(ctx), opts)
		return err
	})
	if err != nil {
		return nil, c.Observe(err)
	}
	return c.tx.begin(ctx, inner, opts, &site), nil
}

// Ping forwards to the inner connection.
func (c *conn) Ping(ctx context.Context) error { return c.Observe(c.pinger.Ping(ctx)) }

// ResetSession forwards to the inner connection; database/sql calls it when
// it hands out a connection that was used before.
func (c *conn) ResetSession(ctx context.Context) error { return c.resetter.ResetSession(ctx) }

// CheckNamedValue forwards to the inner connection.
func (c *conn) CheckNamedValue(nv *driver.NamedValue) error { return c.checker.CheckNamedValue(nv) }

// IsValid is called by database/sql each time the connection goes back to
// the pool; false makes it close the connection. A connection whose inner
// driver has no Validator is checked after a failure that may have broken
// it, so a dead connection (for example after a transaction cancelled by its
// context) never returns to the pool.
func (c *conn) IsValid() bool {
	if c.connector.pins != nil && !c.pin.VerifyUnknown(context.Background()) {
		// What the backend holds is unknown (a lock statement failed and
		// pg_locks could not be read after it): closed, its backend ends,
		// and with it any lock the statement took.
		c.connector.opts.logger.Warn("lockhooks: closing a connection whose advisory locks could not be read after a failed lock statement; its backend ends, and with it any lock the statement may have taken", "connection", c.String())
		return false
	}
	if c.holdsLocks() {
		return false // withdrawn: Close parks it
	}
	if c.pin.Discards.Load() > 0 {
		return false
	}
	if c.connector.pins != nil && c.pin.PinnedUntilClosed() {
		return false // recycled: the pooler unpins it when it disconnects
	}
	if c.connector.opts.verifyOnReturn && c.connector.pins != nil && !c.suspect.Load() {
		c.pin.VerifyOnReturn()
		if c.holdsLocks() {
			return false
		}
	}
	if c.validator != nil {
		return c.validator.IsValid()
	}
	if !c.suspect.Load() {
		return true
	}
	if c.pinger == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	if c.pinger.Ping(ctx) != nil {
		return false
	}
	c.suspect.Store(false)
	return true
}

// Close closes the physical connection, unless it holds session advisory
// locks: then it is parked, open, outside the pool, until its locks are
// unlocked (through any connection of the database) or db.Close.
func (c *conn) Close() error {
	if c.connector.pins != nil && c.park() {
		return nil
	}
	if c.tx.inner != nil {
		c.tx.end() // closed inside a transaction: its locks go with it
	}
	if c.connector.pins != nil {
		c.connector.pins.Unregister(c)
	}
	return c.CloseInner()
}

// Observe records what err says about the connection's health and returns
// err unchanged (driver.ErrSkip must keep its identity), except that a
// deadlock victim's error becomes a *DeadlockError.
func (c *conn) Observe(err error) error {
	if err == nil || err == driver.ErrSkip {
		return err
	}
	if dberr.FromServer(err) {
		c.connector.tel.countError(context.Background(), err)
		if dberr.SQLState(err) == dberr.Deadlock {
			return c.deadlockError(err) // names the locks the transaction held
		}
	} else {
		c.suspect.Store(true)
	}
	return err
}
