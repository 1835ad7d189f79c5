package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/identity"
	"github.com/lockhooks/lockhooks/internal/pgdriver"
	"github.com/lockhooks/lockhooks/internal/pgserver"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"go.opentelemetry.io/otel/trace"
)

// Publishing a holder's identity (see internal/identity), always inside
// statements that run anyway, so that no statement path gains a round trip:
//
//   - Connect's read of the backend pid also reads the application_name the
//     user's configuration gave the connection; lockhooks sets its own only
//     where that is empty.
//   - A transaction's identity rides on its BEGIN, which lockhooks sends
//     itself (pg_begin.go): "BEGIN …; SELECT set_config('application_name',
//     …, true)" in one simple-protocol message. The setting is
//     transaction-local, so nothing outlives the transaction on the server
//     connection: through PgBouncer's transaction mode no other client ever
//     sees it (PgBouncer 1.18 does not reset application_name for clients
//     that set none, so a session-level SET would leak there; 1.25 does).
//     The site is where the transaction began, from the stack tx.begin
//     records anyway, named through the database's callsite.Names.
//   - A session advisory lock's identity rides on the statement that
//     leaves it held: on a connection to the server itself, the exact
//     session-lock or unlock statement of one call (annotatedLockText);
//     elsewhere the pg_locks read that follows it (pg_reconcile.go); and
//     the fencing-token read. They carry the annotation, so the holder's
//     last statement names it while it runs no other (a parked holder, a
//     leaked lock). Nothing is set at session level: a
//     session lock taken through a transaction pooler nobody declared (the
//     pool idle, so the undeclared-pooler guard has not seen it yet) would
//     leave the setting on a server connection that later serves other
//     clients (PgBouncer 1.18 keeps it for clients that set none), where
//     nothing could reset it. Through a declared transaction pooler the
//     holder connection's statements carry the annotation and a
//     transaction-local application_name.
//
// Identities change with every hold, so the statements that carry them must
// not be cached by the driver by their text: pgx (v5) caches every query by
// text by default, so lockhooks runs its own queries there in pgx's simple
// protocol (one round trip, no prepared statement); lib/pq runs queries
// without arguments that way already (pgdriver.Statements, pg_begin.go). On other
// drivers lockhooks publishes nothing (it still reads the identities
// others publish).

// published is what a connection shows other processes of its identity.
type published struct {
	on         bool   // the connection publishes (its application_name was the user's to set, and the user set none)
	connectApp string // its application_name at connect
}

// identifyOnConnect reads, in the one statement Connect runs on Postgres
// anyway, the backend pid and the application_name the user's
// configuration gave the connection (DSN, PGAPPNAME, the connector's
// settings); lockhooks publishes identities only where it is empty. Unless
// the database declared a pooler, the same statement leaves the
// connection's session marker on its backend (see sessionQuery).
func (w *conn) identifyOnConnect(ctx context.Context) error {
	own := w.connector.own.Of(w.inner)
	if !own.OK() {
		_, err := w.backendPID(ctx)
		return err
	}
	marked := !w.connector.opts.txPooler && !w.connector.opts.pinningPooler
	row, err := w.connectRow(ctx, own, marked, true)
	if err != nil && dberr.FromServer(err) && !w.connectionBroken(err) {
		// A server that refuses the marker or the server's identity (one
		// that speaks Postgres's protocol but has no custom settings or
		// no pg_postmaster_start_time): the pool guard without markers,
		// and backend pids matched only within this database.
		w.mark = ""
		row, err = w.connectRow(ctx, own, false, false)
	}
	if err != nil {
		return fmt.Errorf("lockhooks: reading the backend pid of %v: %w", w, w.observe(err))
	}
	pid := int32(pgdriver.AsInt64(row[0]))
	w.pin.PID.Store(pid)
	if k, ok := pgdriver.BackendKeyPID(w.inner); ok && k == int64(pid) {
		w.pin.ReachesServer = true
	}
	if own.PGX {
		w.tx.status = pgdriver.TxStatus(w.inner)
		// The annotated statements of a direct connection may go in pgx's
		// exec mode (sentWith): not where the user asked for the simple
		// protocol.
		w.direct = w.pin.ReachesServer && !w.connector.opts.txPooler && !w.connector.opts.pinningPooler &&
			pgdriver.DefaultMode(w.inner) != own.Args[0].Value
	}
	app := pgdriver.AsString(row[1])
	w.pub.connectApp = app
	w.pub.on = app == "" || strings.HasPrefix(app, identity.AppNamePrefix)
	if len(row) > 2 {
		w.pin.Incarnation = pgsession.ReadIncarnation(pgdriver.AsString(row[2]))
		// The server's start time, the incarnation's second half, names
		// the server (backend pids are per server).
		if _, server, ok := strings.Cut(w.pin.Incarnation, "@"); ok && w.connector.server.Load() == nil {
			w.connector.server.Store(&server)
		}
	}
	if len(row) > 3 {
		w.sawMarker(pgdriver.AsString(row[3]), strconv.Itoa(int(pid)))
	}
	return nil
}

// connectRow runs identifyOnConnect's statement: the backend pid, the
// application_name and, with server, the backend's incarnation (see
// pgsession.IncarnationExpr: its start and its server's) and, marked too, the marker
// found on the backend as the connection's own replaces it.
func (w *conn) connectRow(ctx context.Context, own *pgdriver.Statements, marked, server bool) ([]driver.Value, error) {
	query := "SELECT pg_backend_pid(), current_setting('application_name')"
	want := 2
	if server {
		query += ", " + pgsession.IncarnationExpr
		want = 3
	}
	if server && marked {
		// The marker is hex digits, a colon and a number: a literal is
		// safe, and the simple protocol caches nothing.
		query += ", current_setting('lockhooks.session', true), set_config('lockhooks.session', '" + w.marker() + "', false)"
		want = 5
	}
	rows, err := rawconn.Query(ctx, w.inner, query, own.Args)
	var row *rawconn.Row
	if err == nil {
		row, err = rawconn.ReadRow(rows)
	}
	if err == nil && len(row.Values()) != want {
		err = fmt.Errorf("%d columns, want %d", len(row.Values()), want)
	}
	if err != nil {
		return nil, err
	}
	return row.Values(), nil
}

// holderIdentityLocked is c's identity as a holder of session locks: its
// oldest lock; nil when it holds none. c.pin is locked.
func (c *conn) holderIdentityLocked() *identity.Holder { return c.holderIdentityWithoutLocked(nil) }

// holderIdentityWithoutLocked is holderIdentityLocked as it will be once
// the lock of key skip (if not nil) is released. c.pin is locked.
func (c *conn) holderIdentityWithoutLocked(skip *lockKey) *identity.Holder {
	id := new(identity.Holder)
	if !c.holderIdentityInto(id, skip) {
		return nil
	}
	return id
}

// holderIdentityInto sets *id to c's identity as a holder of session
// locks, leaving out the lock of key skip (if not nil), and reports
// whether it holds any other. c.pin is locked.
func (c *conn) holderIdentityInto(id *identity.Holder, skip *lockKey) bool {
	key, oldest := c.pin.OldestLocked(skip)
	if oldest == nil {
		return false
	}
	c.baseIdentityInto(id)
	var holds [48]byte
	id.Holds = string(advisorykey.Key(key).AppendToken(append(holds[:0], "lock "...)))
	id.Site, id.Since = identity.SafeToken(oldest.Site, "_"), oldest.Since
	id.TraceID, id.SpanID = identity.TraceIDs(oldest.Span)
	return true
}

// baseIdentity names c's process, database and connection.
func (c *conn) baseIdentity() *identity.Holder {
	id := new(identity.Holder)
	c.baseIdentityInto(id)
	return id
}

// baseIdentityInto sets *id to baseIdentity's value.
func (c *conn) baseIdentityInto(id *identity.Holder) {
	*id = identity.Holder{Process: identity.ProcessLabel(), Database: c.connector.seq,
		Pool: identity.SafeToken(c.connector.pool, "_"), Conn: c.id}
}

// txAppName is the application_name of c's transaction begun at site.
func (c *conn) txAppName(site string) string {
	id := c.baseIdentity()
	id.Holds, id.Site = "tx", identity.SafeToken(site, "_")
	return id.AppName()
}

// ownLocksQuery is the read of backend pid's advisory locks that
// queryOwnLocks runs on c, and its arguments. On a connection that holds
// session locks it begins with the holder's annotation (holderNote); such
// a text changes with every hold, so pgx runs it in the simple protocol,
// while the plain read (a connection that holds nothing) stays a cached
// statement. Through a declared transaction pooler c reads its holder's
// locks from another backend, and annotates nothing here.
//
// The plain read is composed once per connection; a holder's text is
// composed in one buffer, so that the read costs an allocation or two, not
// one per field.
func (c *conn) ownLocksQuery(pid int32) (query string, args []driver.NamedValue) {
	own := &c.connector.own
	if !own.OK() || c.connector.opts.txPooler {
		return c.fixedLocksQuery(pid), nil
	}
	var id identity.Holder
	c.pin.Lock()
	holding := c.holderIdentityInto(&id, nil)
	c.pin.Unlock()
	if !holding {
		return c.fixedLocksQuery(pid), nil
	}
	var buf [1024]byte
	b := id.AppendAnnotation(buf[:0])
	b = pgserver.AppendOwnLocksQuery(b, "(SELECT 1) one", pid, c.afterDiscard())
	return string(b), own.Args // a text of this hold's: not for pgx's statement cache
}

// fixedLocksQuery is c's read of backend pid's advisory locks when it
// holds none: the same text until pid or the DISCARD ALLs change,
// composed once.
func (c *conn) fixedLocksQuery(pid int32) string {
	discards := c.discards.Load()
	c.pin.Lock()
	defer c.pin.Unlock()
	t := &c.readTexts
	if t.pid != pid || t.discards != discards || t.plain == "" {
		*t = fixedReads{pid: pid, discards: discards,
			plain: string(pgserver.AppendOwnLocksQuery(nil, "(SELECT 1) one", pid, c.afterDiscard()))}
	}
	return t.plain
}

// fixedReads is a connection's read of pg_locks that does not change with
// what it holds (fixedLocksQuery), for one backend pid and DISCARD ALL
// count.
type fixedReads struct {
	pid      int32
	discards int32
	plain    string
}

// holderNote is the annotation that names c as the holder of its session
// locks on a statement of lockhooks' own run on c's backend, and the
// arguments that keep the statement out of the driver's statement cache;
// "" and nil when c holds none, when its driver cannot run such texts
// uncached, or through a declared transaction pooler (c's statements run
// on any backend; its holder connection's carry the annotation instead).
func (c *conn) holderNote() (string, []driver.NamedValue) { return c.holderNoteWithout(nil) }

// holderNoteWithout is holderNote as it will be once the lock of key skip
// (if not nil) is released: for the statement that releases it.
func (c *conn) holderNoteWithout(skip *lockKey) (string, []driver.NamedValue) {
	own := &c.connector.own
	if !own.OK() || c.connector.opts.txPooler {
		return "", nil
	}
	c.pin.Lock()
	id := c.holderIdentityWithoutLocked(skip)
	c.pin.Unlock()
	if id == nil {
		return "", nil
	}
	return id.Annotation(), own.Args
}

// annotatedLockText is text, an exact session-lock statement of one call
// (of key k, at site) on a connection that reaches the server itself
// (c.direct), beginning with the annotation that names c as the holder of
// its session locks as the statement leaves them; "" when it leaves none
// (an unlock of the last one: the text stays the user's); suffix ends it
// (AcquireAdvisoryLock's fencing token: see tokenAfterLockKey). No
// pg_locks read follows such a statement (beforeAdvisory), so the
// statement is what names the holder while it runs no other, as the read
// did. The text may change with every hold: it runs in pgx's
// QueryExecModeExec (one round trip, the arguments bound by the server,
// nothing cached) unless the connection sent it lately (sentWith), and
// either way the server shows it as sent, which the end requests of
// pg_loss.go compare.
//
// The lock it takes names no since: it is held from the statement's end,
// which the server shows (pg_stat_activity's state_change; see identify),
// not from its start (a lock may wait), and a text without a time can be
// the same at every hold.
func (c *conn) annotatedLockText(ctx context.Context, call sqlscan.AdvisoryCall, k lockKey, site, text, suffix string) string {
	var id identity.Holder
	unlock := call.Func&sqlscan.FnUnlock != 0
	c.pin.Lock()
	var skip *lockKey
	if l := c.pin.Held[k]; unlock && l != nil && l.Count <= 1 {
		skip = &k
	}
	holding := c.holderIdentityInto(&id, skip)
	c.pin.Unlock()
	if !holding {
		if unlock {
			return ""
		}
		c.baseIdentityInto(&id)
		var holds [48]byte
		id.Holds = string(advisorykey.Key(k).AppendToken(append(holds[:0], "lock "...)))
		id.Site = identity.SafeToken(site, "_")
		id.TraceID, id.SpanID = identity.TraceIDs(trace.SpanContextFromContext(ctx))
	}
	var buf [512]byte
	return string(append(append(id.AppendAnnotation(buf[:0]), text...), suffix...))
}

// ReleaseLockSavepoint ends the savepoint of a statement run on c's
// transaction-pooler holder (pgsession.TxHolder.Run). On a connection that publishes
// identities it also sets the holder's application_name for its
// transaction and begins with the annotation, so that the holder's last
// statement names it: the oldest lock it holds, or the one being taken
// (where ctx says, now).
func (c *conn) ReleaseLockSavepoint(ctx context.Context, h driver.Conn) error {
	const release = "RELEASE SAVEPOINT lockhooks_lock"
	if !c.connector.own.OK() {
		return rawconn.Exec(ctx, h, release)
	}
	c.pin.Lock()
	id := c.holderIdentityLocked()
	c.pin.Unlock()
	if id == nil {
		id = c.baseIdentity()
		id.Holds, id.Site, id.Since = "lock", identity.SafeToken(siteOf(ctx), "_"), time.Now()
		id.TraceID, id.SpanID = identity.TraceIDs(trace.SpanContextFromContext(ctx))
	}
	q := id.Annotation() + release
	if c.pub.on {
		q += "; SELECT " + identity.SetAppName(id.AppName(), true, 0)
	}
	return rawconn.ExecSimple(ctx, h, q)
}
