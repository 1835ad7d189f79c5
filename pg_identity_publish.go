package lockhooks

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Publishing a holder's identity (see pg_identity.go), always inside
// statements that run anyway, so that no statement path gains a round trip:
//
//   - Connect's read of the backend pid also reads the application_name the
//     user's configuration gave the connection; lockhooks sets its own only
//     where that is empty.
//   - A transaction's identity rides on its BEGIN: lockhooks sends
//     "BEGIN …; SELECT set_config('application_name', …, true)" itself (one
//     simple-protocol message, one round trip) and commits it itself. The
//     setting is transaction-local, so nothing outlives the transaction on
//     the server connection: through PgBouncer's transaction mode no other
//     client ever sees it (PgBouncer 1.18 does not reset application_name
//     for clients that set none, so a session-level SET would leak there;
//     1.25 does).
//   - A session advisory lock's identity rides on the pg_locks read that
//     follows every session-lock statement (pg_reconcile.go): the read
//     carries the annotation, and set_config(…, false) when the identity
//     changed, guarded by pg_backend_pid() so that it only lands on the
//     connection's own backend. Through a declared transaction pooler the
//     holder connection's statements carry them instead, transaction-local.
//
// Identities change with every hold, so the statements that carry them must
// not be cached by the driver by their text: pgx (v5) caches every query by
// text by default, so lockhooks runs its own queries there in pgx's simple
// protocol (one round trip, no prepared statement); lib/pq runs queries
// without arguments that way already. On other drivers lockhooks publishes
// nothing (it still reads the identities others publish).

// dbIdentity is what one database needs to publish identities.
type dbIdentity struct {
	once    sync.Once
	seq     uint64
	publish bool                // lockhooks' own statements run uncached, so they may carry identities
	simple  []driver.NamedValue // pgx: the argument that runs a query in the simple protocol

	sitesMu sync.RWMutex
	sites   map[uintptr]string // call sites of BeginTx by program counter ("" for lockhooks' and database/sql's own frames)
}

// identity returns the database's identity settings, working out, at the
// first connection, what the driver allows.
func (c *connector) identity(inner driver.Conn) *dbIdentity {
	d := &c.ident
	d.once.Do(func() {
		d.seq = databaseSeq.Add(1)
		switch packageOf(inner) {
		case "github.com/jackc/pgx/v5/stdlib":
			if arg, ok := pgxSimpleProtocol(reflect.TypeOf(inner)); ok {
				d.publish, d.simple = true, []driver.NamedValue{{Ordinal: 1, Value: arg}}
			}
		case "github.com/lib/pq":
			d.publish = true // its queries without arguments use the simple protocol
		}
	})
	return d
}

// identityPool is the database's pool name in identities; empty until the
// database has a pool name of its own (the process-wide holders model,
// issue 20a, adds WithPoolName).
func (c *connector) identityPool() string { return "" }

// connIdentity is what a connection published.
type connIdentity struct {
	on         bool   // the connection publishes (its application_name was the user's to set, and the user set none)
	connectApp string // its application_name at connect
	appName    string // the session-level application_name lockhooks last set ("" for none); guarded by pin.mu

	beginSite string           // the site beginText was made for,
	beginOpts driver.TxOptions // and the options
	beginText string
}

// identifyOnConnect reads, in the one statement Connect runs on Postgres
// anyway, the backend pid and the application_name the user's
// configuration gave the connection (DSN, PGAPPNAME, the connector's
// settings); lockhooks publishes identities only where it is empty.
func (w *conn) identifyOnConnect(ctx context.Context) error {
	d := w.connector.identity(w.inner)
	if !d.publish {
		_, err := w.backendPID(ctx)
		return err
	}
	rows, err := queryDirect(ctx, w.inner, "SELECT pg_backend_pid(), current_setting('application_name')", d.simple)
	var row *staticRows
	if err == nil {
		row, err = readStaticRow(rows)
	}
	if err == nil && len(row.row) != 2 {
		err = fmt.Errorf("lockhooks: reading the backend pid of %v: no row", w)
	}
	if err != nil {
		return fmt.Errorf("lockhooks: reading the backend pid of %v: %w", w, w.observe(err))
	}
	w.pid.Store(int32(asInt64(row.row[0])))
	app := asString(row.row[1])
	w.pub.connectApp = app
	w.pub.on = app == "" || strings.HasPrefix(app, appNamePrefix)
	return nil
}

// holderIdentityLocked is c's identity as a holder of session locks: its
// oldest lock; nil when it holds none. c.pin.mu is held.
func (c *conn) holderIdentityLocked() *holderIdentity {
	var oldest *heldLock
	var key lockKey
	for k, l := range c.pin.held {
		if oldest == nil || l.since.Before(oldest.since) {
			oldest, key = l, k
		}
	}
	if oldest == nil {
		return nil
	}
	id := c.baseIdentity()
	id.Holds = "lock " + keyToken(key)
	id.Site, id.Since = safeToken(oldest.site, "_"), oldest.since
	id.TraceID, id.SpanID = traceIDs(oldest.span)
	return id
}

// baseIdentity names c's process, database and connection.
func (c *conn) baseIdentity() *holderIdentity {
	return &holderIdentity{Process: processLabel(), Database: c.connector.ident.seq,
		Pool: safeToken(c.connector.identityPool(), "_"), Conn: c.id}
}

// keyToken writes k for an identity: 42, 1/2, 42-shared.
func keyToken(k lockKey) string {
	s := strconv.FormatInt(k.k1, 10)
	if k.pair {
		s += "/" + strconv.FormatInt(k.k2, 10)
	}
	if k.shared {
		s += "-shared"
	}
	return s
}

// setAppName is the SQL expression that sets application_name to value
// (local: for the transaction only), unless the user set one: a value that
// is empty or lockhooks' own is replaced, any other is kept. onPID, if not
// 0, sets it only on that backend.
func setAppName(value string, local bool, onPID int32) string {
	cond := "(current_setting('application_name') = '' OR current_setting('application_name') LIKE '" + appNamePrefix + "%')"
	if onPID != 0 {
		cond = "pg_backend_pid() = " + strconv.Itoa(int(onPID)) + " AND " + cond
	}
	return "set_config('application_name', CASE WHEN " + cond + " THEN '" + value + "' ELSE current_setting('application_name') END, " +
		strconv.FormatBool(local) + ")"
}

// ownLocksQuery is the read of backend pid's advisory locks that
// queryOwnLocks runs on c, and its arguments. On a connection that
// publishes its identity and holds session locks, it begins with the
// holder's annotation and, when the identity changed, sets
// application_name; setTo is then the value to remember once the read ran
// on pid. Such a text changes with every hold, so pgx runs it in the
// simple protocol; the plain read (a connection that holds nothing) stays a
// cached statement. Through a declared transaction pooler c reads its
// holder's locks from another backend, and publishes nothing here.
func (c *conn) ownLocksQuery(pid int32) (query string, args []driver.NamedValue, setTo *string) {
	from := "(SELECT 1) one"
	var note string
	d := &c.connector.ident
	if d.publish && !c.connector.opts.txPooler {
		c.pin.mu.Lock()
		id := c.holderIdentityLocked()
		current := c.pub.appName
		c.pin.mu.Unlock()
		want := ""
		if id != nil {
			note = id.annotation()
			want = id.appName()
		}
		if c.pub.on && want != current {
			from = "(SELECT " + setAppName(want, false, pid) + ") one"
			setTo = &want
		}
		if note != "" || setTo != nil {
			args = d.simple // a text of this hold's: not for pgx's statement cache
		}
	}
	of := "pg_backend_pid()" // pid 0: the backend that answers
	if pid != 0 {
		of = strconv.Itoa(int(pid))
	}
	return note + `SELECT pg_backend_pid(), l.classid::bigint, l.objid::bigint, l.objsubid::int, l.mode
FROM ` + from + ` LEFT JOIN pg_locks l ON l.pid = ` + of + ` AND l.locktype = 'advisory' AND l.granted` + c.afterDiscard(), args, setTo
}

// publishedAppName records what the read set.
func (c *conn) publishedAppName(v string) {
	c.pin.mu.Lock()
	c.pub.appName = v
	c.pin.mu.Unlock()
}

// beginIdentified begins a Postgres transaction whose BEGIN also sets, for
// the transaction only, application_name to the transaction's identity
// (where it began), in one simple-protocol message. ok is false where
// lockhooks leaves BEGIN to the driver: a connection that does not publish,
// one that holds session locks (its application_name names them), options
// the driver refuses.
func (c *conn) beginIdentified(ctx, innerCtx context.Context, opts driver.TxOptions) (t driver.Tx, ok bool, err error) {
	d := &c.connector.ident
	if !c.pub.on || !d.publish || c.execer == nil || c.holdsLocks() {
		return nil, false, nil
	}
	var iso string
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		iso = " ISOLATION LEVEL READ UNCOMMITTED"
	case sql.LevelReadCommitted:
		iso = " ISOLATION LEVEL READ COMMITTED"
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		iso = " ISOLATION LEVEL REPEATABLE READ"
	case sql.LevelSerializable:
		iso = " ISOLATION LEVEL SERIALIZABLE"
	default:
		return nil, false, nil // the driver says what it does not support
	}
	site := d.callerSite()
	if site != c.pub.beginSite || opts != c.pub.beginOpts || c.pub.beginText == "" {
		// A connection that runs one code path's transactions builds its
		// BEGIN once.
		begin := "BEGIN" + iso
		if opts.ReadOnly {
			begin += " READ ONLY"
		}
		id := c.baseIdentity()
		id.Holds, id.Site = "tx", safeToken(site, "_")
		c.pub.beginSite, c.pub.beginOpts = site, opts
		c.pub.beginText = begin + "; SELECT " + setAppName(id.appName(), true, 0)
	}
	if _, err := c.execer.ExecContext(innerCtx, c.pub.beginText, nil); err != nil {
		return nil, true, c.observe(err)
	}
	return c.tx.begin(ctx, identifiedTx{c}, opts), true, nil
}

// commitChecked commits only a live transaction: in one that a failed
// statement aborted, Postgres answers COMMIT with ROLLBACK and no error,
// which a driver's own Commit reports (pgx: "commit unexpectedly resulted
// in rollback") and a plain COMMIT through Exec cannot; the SELECT before
// it fails there instead (25P02), and COMMIT does not run.
const commitChecked = "SELECT /*lockhooks: only a live transaction commits*/; COMMIT"

// identifiedTx is a Postgres transaction lockhooks began itself
// (beginIdentified); it commits and rolls back as the driver's own would,
// with the context BeginTx was given, never cut by its cancellation (as
// BeginTx does for the driver's transactions, see conn.BeginTx).
type identifiedTx struct{ c *conn }

func (t identifiedTx) ctx() context.Context {
	if ctx := t.c.tx.ctx; ctx != nil {
		return context.WithoutCancel(ctx)
	}
	return context.Background()
}

// Commit commits; a transaction that was aborted is rolled back and
// reported.
func (t identifiedTx) Commit() error {
	_, err := t.c.execer.ExecContext(t.ctx(), commitChecked, nil)
	if sqlState(err) != "25P02" {
		return err
	}
	if _, rerr := t.c.execer.ExecContext(t.ctx(), "ROLLBACK", nil); rerr != nil {
		return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it (%w), and its ROLLBACK failed too: %w", err, rerr)
	}
	return fmt.Errorf("lockhooks: commit unexpectedly resulted in rollback: a statement of the transaction failed, so Postgres aborted it; it was rolled back: %w", err)
}

// Rollback rolls back.
func (t identifiedTx) Rollback() error {
	_, err := t.c.execer.ExecContext(t.ctx(), "ROLLBACK", nil)
	return err
}

// callerSite returns file:line of the first caller outside database/sql
// and lockhooks, symbolising each program counter once.
func (d *dbIdentity) callerSite() string {
	var pcs [24]uintptr
	n := runtime.Callers(3, pcs[:])
	for _, pc := range pcs[:n] {
		d.sitesMu.RLock()
		s, ok := d.sites[pc]
		d.sitesMu.RUnlock()
		if !ok {
			s = siteOfPC(pc)
			d.sitesMu.Lock()
			if d.sites == nil || len(d.sites) > 4096 {
				d.sites = make(map[uintptr]string)
			}
			d.sites[pc] = s
			d.sitesMu.Unlock()
		}
		if s != "" {
			return s
		}
	}
	return "unknown"
}

// siteOfPC is file:line of the frame at return address pc (the innermost
// of its inlined frames outside database/sql and lockhooks), or "" when
// every frame there is theirs or the runtime's.
func siteOfPC(pc uintptr) string {
	frames := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := frames.Next()
		internal := strings.HasPrefix(f.Function, "database/sql.") ||
			(strings.HasPrefix(f.Function, "github.com/lockhooks/lockhooks.") && !strings.HasSuffix(f.File, "_test.go"))
		if !internal && f.Function != "" && !strings.HasPrefix(f.Function, "runtime.") {
			return shortFile(f.File) + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return ""
		}
	}
}

// execSimple runs a statement text of lockhooks' own that may hold
// several statements (simple protocol: drivers run Exec without arguments
// that way) on a raw connection.
func execSimple(ctx context.Context, c driver.Conn, query string) error {
	if e, ok := c.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
		return err
	}
	return execDirect(ctx, c, query)
}

// releaseLockSavepoint ends the savepoint of a statement run on c's
// transaction-pooler holder (runOnHolder). On a connection that publishes
// identities it also sets the holder's application_name for its
// transaction and begins with the annotation, so that the holder's last
// statement names it: the oldest lock it holds, or the one being taken
// (where ctx says, now).
func (c *conn) releaseLockSavepoint(ctx context.Context, h *holderConn) error {
	const release = "RELEASE SAVEPOINT lockhooks_lock"
	d := &c.connector.ident
	if !d.publish {
		return execDirect(ctx, h.inner, release)
	}
	c.pin.mu.Lock()
	id := c.holderIdentityLocked()
	c.pin.mu.Unlock()
	if id == nil {
		id = c.baseIdentity()
		id.Holds, id.Site, id.Since = "lock", safeToken(siteOf(ctx), "_"), time.Now()
		id.TraceID, id.SpanID = traceIDs(trace.SpanContextFromContext(ctx))
	}
	q := id.annotation() + release
	if c.pub.on {
		q += "; SELECT " + setAppName(id.appName(), true, 0)
	}
	return execSimple(ctx, h.inner, q)
}
