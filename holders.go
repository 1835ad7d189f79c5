package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The model of holders and waiters, one per process.
//
// Every lockhooks database (a connector) joins the process's registry when
// it is opened and leaves it at Close. A holder (a connection that holds a
// lock, or is inside a transaction) has one identity, built here and only
// here: its database (pool name), connection number, backend pid, Go call
// site (where it took the lock, or where its transaction began), since
// when, and span context. Errors, the slow-wait log, spans, metrics and
// /debug/locks ask this file who holds what a waiter waits for and only
// format the answer, so a holder is named the same way everywhere, also
// when it is a connection of another *sql.DB of the process (another
// replica of the same service, say).

// maxDatabases bounds the registry. A database opened beyond it works as
// any other, but waiters of other databases cannot name its connections.
const maxDatabases = 1024

// registry is the set of lockhooks databases open in this process:
// lockhooks' one piece of process-wide state besides the driver names
// sql.Register keeps. It holds each database from Open to Close (an
// unclosed *sql.DB is never freed anyway: its pool's goroutine keeps it),
// at most maxDatabases of them.
type registry struct {
	mu  sync.RWMutex
	dbs []*connector
}

// databases is the process's registry.
var databases registry

// join registers c and settles its pool name: the one WithPoolName gave,
// or its default, made unique among the open databases by a "#2", "#3"…
// suffix (two *sql.DB on one DSN are two pools; their gauges must not
// share one attribute set).
func (r *registry) join(c *connector, defaultName string) {
	r.mu.Lock()
	clash := false
	defer func() {
		r.mu.Unlock()
		if clash { // the user's logger runs outside the registry's lock
			c.opts.logger.Warn("lockhooks: two open databases have the same pool name (WithPoolName); their gauges and the holders they name cannot be told apart",
				"pool", c.pool)
		}
	}()
	taken := func(name string) bool {
		for _, o := range r.dbs {
			if o.pool == name {
				return true
			}
		}
		return false
	}
	if c.opts.poolName != "" {
		c.pool = c.opts.poolName
		clash = taken(c.pool)
	} else {
		c.pool = defaultName
		for n := 2; taken(c.pool); n++ {
			c.pool = defaultName + "#" + strconv.Itoa(n)
		}
	}
	if len(r.dbs) < maxDatabases {
		r.dbs = append(r.dbs, c)
		c.joined = true
	}
}

// leave forgets c (db.Close).
func (r *registry) leave(c *connector) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.dbs {
		if o == c {
			r.dbs = append(r.dbs[:i], r.dbs[i+1:]...)
			return
		}
	}
}

// list returns the open databases.
func (r *registry) list() []*connector {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]*connector(nil), r.dbs...)
}

// connByPID returns the connection of any open Postgres database of the
// process whose backend is pid (the connection's own, or the holder
// connection it keeps through a transaction pooler), or nil.
func (r *registry) connByPID(pid int32) *conn {
	if pid == 0 {
		return nil
	}
	for _, c := range r.list() {
		if c.opts.dialect != Postgres {
			continue
		}
		for _, oc := range c.openConns() {
			if oc.pid.Load() == pid || oc.holderPID.Load() == pid {
				return oc
			}
		}
	}
	return nil
}

// What a holder's Site is (holder.SiteKind).
const (
	siteNone  = ""
	siteTook  = "took_lock"         // where it took the lock
	siteBegan = "began_transaction" // where its transaction began
	siteLater = "later_statement"   // where its transaction ran a later statement
)

// holder is one holder of a lock someone waits for: the identity every
// consumer shows (the page's JSON, errors, log lines, span attributes).
type holder struct {
	Database  string    `json:"database,omitempty"` // its database's pool name
	Conn      uint64    `json:"conn"`
	PID       int32     `json:"pid,omitempty"`
	Key       string    `json:"key,omitempty"`       // what it holds that the waiter wants, when known
	Site      string    `json:"site,omitempty"`      // where it took the lock, or where its transaction began
	Since     time.Time `json:"since,omitzero"`      // when it took the lock, or began its transaction
	Statement string    `json:"statement,omitempty"` // the statement holding it (SQLite autocommit), or the backend's last statement
	State     string    `json:"state,omitempty"`     // the backend's state, as pg_stat_activity says
	TraceID   string    `json:"trace_id,omitempty"`  // the trace of the span it took the lock (or began its transaction) in
	SiteKind  string    `json:"site_kind,omitempty"` // what Site is: took_lock | began_transaction | later_statement
	running   bool      // Statement is what holds the lock (an autocommit statement), not the last one
	span      trace.SpanContext
}

// debugHolder is a holder as the debug page's waiters list it: in this
// process (a connection of any lockhooks database); blocking backends
// outside it are the waiters' Blockers.
type debugHolder = holder

func (h holder) age() time.Duration {
	if h.Since.IsZero() {
		return 0
	}
	return time.Since(h.Since).Round(time.Millisecond)
}

// who is the holder's connection: `connection #3 of "orders" (backend pid 812)`.
func (h holder) who() string {
	var b strings.Builder
	if h.Conn != 0 {
		fmt.Fprintf(&b, "connection #%d", h.Conn)
	} else {
		b.WriteString("a connection")
	}
	if h.Database != "" {
		fmt.Fprintf(&b, " of %q", h.Database)
	}
	if h.PID != 0 {
		fmt.Fprintf(&b, " (backend pid %d)", h.PID)
	}
	return b.String()
}

// where says where the holder took the lock or is, or "".
func (h holder) where() string {
	switch {
	case h.running && h.Statement != "":
		return fmt.Sprintf("running the statement %.200q", h.Statement)
	case h.SiteKind == siteTook && h.Site != "":
		return "which took it at " + h.Site
	case h.SiteKind == siteBegan && h.Site != "":
		return "in a transaction begun at " + h.Site
	case h.SiteKind == siteLater && h.Site != "":
		return "in a transaction that ran a statement at " + h.Site
	}
	return ""
}

// String names the holder, the one way every message does: who, where it
// took the lock or began its transaction, for how long, and its trace.
func (h holder) String() string {
	parts := []string{h.who()}
	if w := h.where(); w != "" {
		parts = append(parts, w)
	}
	if !h.Since.IsZero() {
		parts = append(parts, "for "+h.age().String())
	}
	if h.State != "" {
		parts = append(parts, h.State)
	}
	if !h.running && h.Statement != "" {
		parts = append(parts, fmt.Sprintf("last statement %.120q", h.Statement))
	}
	if h.TraceID != "" {
		parts = append(parts, "trace "+h.TraceID)
	}
	return strings.Join(parts, ", ")
}

// logArgs are the holder's attributes in a log line.
func (h holder) logArgs() []any {
	args := []any{"holder", h.String()}
	if h.Database != "" {
		args = append(args, "holder_database", h.Database)
	}
	if h.Conn != 0 {
		args = append(args, "holder_connection", h.Conn)
	}
	if h.PID != 0 {
		args = append(args, "holder_pid", h.PID)
	}
	if h.Site != "" {
		args = append(args, "holder_site", h.Site)
	}
	if !h.Since.IsZero() {
		args = append(args, "holder_age", h.age().String())
	}
	if h.TraceID != "" {
		args = append(args, "holder_trace_id", h.TraceID)
	}
	return args
}

// spanAttrs are the holder's attributes on a wait span (and its link).
func (h holder) spanAttrs() []attribute.KeyValue {
	site := h.Site
	if site == "" && h.running && h.Statement != "" {
		site = "statement " + strconv.Quote(truncate(h.Statement, 120))
	}
	attrs := []attribute.KeyValue{AttrHolderSite.String(site)}
	if !h.Since.IsZero() {
		attrs = append(attrs, AttrHolderSince.String(h.Since.UTC().Format(time.RFC3339Nano)))
	}
	if h.PID != 0 {
		attrs = append(attrs, AttrHolderPID.Int64(int64(h.PID)))
	}
	if h.Database != "" {
		attrs = append(attrs, AttrHolderPool.String(h.Database))
	}
	if h.Conn != 0 {
		attrs = append(attrs, AttrHolderConn.Int64(int64(h.Conn)))
	}
	return attrs
}

// withSpan sets the holder's span context and trace id.
func (h holder) withSpan(span trace.SpanContext) holder {
	h.span = span
	if span.IsValid() {
		h.TraceID = span.TraceID().String()
	}
	return h
}

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holder {
	if oc == nil {
		return holder{}
	}
	return holder{Database: oc.connector.pool, Conn: oc.id, PID: oc.pid.Load()}
}

// describeHolders is the holder part of a slow-wait line or an error:
// every holder, then the backends outside this process that block.
func describeHolders(holders []holder, blockers []pgBlocker, err error) string {
	var parts []string
	for _, h := range holders {
		parts = append(parts, h.String())
	}
	for _, b := range blockers {
		s := fmt.Sprintf("backend pid %d", b.PID)
		if b.ApplicationName != "" {
			s += fmt.Sprintf(" (%q)", b.ApplicationName)
		}
		s += ", " + b.State
		if b.XactSeconds >= 0 {
			s += fmt.Sprintf(", transaction open %.1fs", b.XactSeconds)
		}
		if b.Query != "" {
			s += fmt.Sprintf(", last statement %.120q", b.Query)
		}
		parts = append(parts, s)
	}
	if err != nil {
		parts = append(parts, "(reading pg_blocking_pids failed: "+err.Error()+")")
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, "; ")
}

func slicesContainsConn(hs []holder, db string, id uint64) bool {
	for _, h := range hs {
		if h.Conn == id && h.Database == db {
			return true
		}
	}
	return false
}

// txIdent is a connection's open transaction as other goroutines see it:
// when and where it began, its span and the context it was begun with. The
// transaction's own state (tx) belongs to the connection's goroutine; this
// copy is guarded by mu.
type txIdent struct {
	g     atomic.Uintptr // the goroutine that began it (currentG), for self-waits
	mu    sync.Mutex
	open  bool
	since time.Time
	site  callers
	span  trace.SpanContext
	ctx   context.Context
}

// set records that a transaction began with ctx at site (nil: not
// recorded).
func (t *txIdent) set(ctx context.Context, since time.Time, site *callers) {
	t.g.Store(currentG())
	t.mu.Lock()
	t.open, t.since, t.ctx = true, since, ctx
	t.span = trace.SpanContextFromContext(ctx)
	if site != nil {
		t.site = *site
	} else {
		t.site.n = 0
	}
	t.mu.Unlock()
}

// clear records that the transaction ended.
func (t *txIdent) clear() {
	t.g.Store(0)
	t.mu.Lock()
	t.open, t.ctx, t.site.n = false, nil, 0
	t.mu.Unlock()
}

// snapshot returns the transaction's identity, if one is open.
func (t *txIdent) snapshot() (since time.Time, site callers, span trace.SpanContext, ctx context.Context, open bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.since, t.site, t.span, t.ctx, t.open
}

// asHolder is connection oc as the holder of what a waiter for keys waits
// for: the session lock it holds among keys (where and when it took it),
// else its open transaction (where and when it began).
func (oc *conn) asHolder(keys []lockKey) holder {
	h := connHolder(oc)
	if oc.connector.pins != nil {
		oc.pin.mu.Lock()
		for _, k := range keys {
			for _, hk := range conflicting(k) {
				if l := oc.pin.held[hk]; l != nil && h.SiteKind == siteNone {
					h.Key, h.Site, h.Since, h.SiteKind = hk.String(), l.site, l.since, siteTook
					h = h.withSpan(l.span)
				}
			}
		}
		oc.pin.mu.Unlock()
		if h.SiteKind != siteNone {
			return h
		}
	}
	since, site, span, _, open := oc.ident.snapshot()
	if open {
		h.Since, h.SiteKind = since, siteBegan
		if site.n > 0 {
			h.Site = site.String()
		}
		h = h.withSpan(span)
	}
	return h
}

// conflicting returns the modes of k's key that conflict with a request
// for k: both for an exclusive request, the exclusive one for a shared.
func conflicting(k lockKey) []lockKey {
	ex := k.exclusive()
	if k.shared {
		return []lockKey{ex}
	}
	sh := ex
	sh.shared = true
	return []lockKey{ex, sh}
}

// holdersOf finds who holds what the wait v waits for: in-process holders
// from the lock tables and the advisory-lock tracking and, on Postgres,
// the backends pg_blocking_pids names; a backend that is a connection of
// any lockhooks database of this process is a holder with its full
// identity, the others are returned as blockers.
func (c *connector) holdersOf(ctx context.Context, v waitView) ([]holder, []pgBlocker, error) {
	holders := c.inProcessHolders(v, c.inProcessEdges())
	if c.opts.dialect != Postgres || v.conn == nil || v.conn.pid.Load() == 0 {
		return holders, nil, nil
	}
	pid := v.conn.pid.Load()
	blocked, err := c.blockersOf(ctx, []int32{pid})
	if err != nil {
		return holders, nil, err
	}
	if b := blocked[pid]; b != nil {
		holders, rest := resolveBlockers(holders, b.blockers, v.advKeys)
		return holders, rest, nil
	}
	return holders, nil, nil // not waiting on the server (an in-process queue)
}

// resolveBlockers turns the blocking backends that are connections of a
// lockhooks database of this process into holders (with their call site,
// age and trace), and returns the rest.
func resolveBlockers(holders []holder, blockers []pgBlocker, keys []lockKey) ([]holder, []pgBlocker) {
	rest := []pgBlocker{}
	for _, b := range blockers {
		oc := databases.connByPID(b.PID)
		if oc == nil {
			rest = append(rest, b)
			continue
		}
		if slicesContainsConn(holders, oc.connector.pool, oc.id) {
			continue
		}
		h := oc.asHolder(keys)
		h.PID, h.State = b.PID, b.State
		if h.SiteKind != siteTook {
			// The last statement of a transaction tells where it is; that of
			// a session-lock holder is often lockhooks' own pg_locks read.
			h.Statement = b.Query
		}
		if h.Since.IsZero() && b.XactSeconds >= 0 {
			h.Since = time.Now().Add(-time.Duration(b.XactSeconds * float64(time.Second)))
		}
		holders = append(holders, h)
	}
	return holders, rest
}

// inProcessHolders returns the holders in this process of what v waits
// for: from the lock tables' edges, and from the advisory-lock tracking.
func (c *connector) inProcessHolders(v waitView, edges []inProcessEdge) []holder {
	holders := []holder{}
	if v.conn == nil {
		return holders
	}
	for _, e := range edges {
		if e.waiter == v.conn {
			holders = append(holders, e.holder)
		}
	}
	if c.pins != nil {
		for _, k := range v.advKeys {
			holders = append(holders, c.pinHolders(k, v.conn)...)
		}
	}
	return holders
}

// pinHolders returns the connections other than except that hold k or a
// session lock that conflicts with it.
func (c *connector) pinHolders(k lockKey, except *conn) []holder {
	var out []holder
	for _, h := range c.pins.snapshot() {
		if h == except {
			continue
		}
		h.pin.mu.Lock()
		for _, hk := range conflicting(k) {
			if l := h.pin.held[hk]; l != nil {
				x := connHolder(h)
				x.Key, x.Site, x.Since, x.SiteKind = hk.String(), l.site, l.since, siteTook
				out = append(out, x.withSpan(l.span))
			}
		}
		h.pin.mu.Unlock()
	}
	return out
}

// inProcessEdge is one in-process wait: waiter waits for a lock holder
// holds, in one of the database's lock tables.
type inProcessEdge struct {
	kind   string // advisory | lockset | sqlite_writer
	waiter *conn
	since  time.Time // when the waiter began waiting
	wsite  string    // where the waiter asked
	holder holder
}

// lockKeyName names a key for messages: a lockset id as namespace / id,
// else the key as given. The one place names for keys plug in.
func lockKeyName(namespace, key string) string {
	if namespace != "" {
		return namespace + " / " + key
	}
	return key
}

// tableHolder is the identity of a lockTable entry's holder.
func tableHolder(key string, h holderInfo) holder { return tableHolderNamed(key, h, nil) }

// tableHolderNamed is tableHolder with the call sites symbolised through
// sym, when not nil (a page or a list of many waiters shares sites).
func tableHolderNamed(key string, h holderInfo, sym siteNames) holder {
	x := connHolder(ownerConn(h.owner))
	x.Key, x.Since, x.SiteKind = key, h.since, siteTook
	if h.site.n > 0 {
		if sym != nil {
			x.Site = sym.of(&h.site)
		} else {
			x.Site = h.site.String()
		}
	}
	return x.withSpan(h.span)
}

// inProcessEdges lists who waits for whom in the in-process lock tables:
// SQLite's advisory locks, Postgres AcquireAdvisoryLock's queue, locksets
// and the writer lock.
func (c *connector) inProcessEdges() []inProcessEdge {
	var out []inProcessEdge
	sym := siteNames{} // many waiters share a call site: symbolise each once
	named := func(key int64, h holderInfo, w waiterInfo) {
		out = append(out, inProcessEdge{kind: "advisory", waiter: ownerConn(w.owner), since: w.since, wsite: sym.of(&w.site),
			holder: tableHolderNamed(describeKey(key), h, sym)})
	}
	c.named.waits(named)
	c.turns.waits(named) // AcquireAdvisoryLock's in-process queue (Postgres)
	c.locksets.waits(func(key locksetKey, h holderInfo, w waiterInfo) {
		out = append(out, inProcessEdge{kind: "lockset", waiter: ownerConn(w.owner), since: w.since, wsite: sym.of(&w.site),
			holder: tableHolderNamed(lockKeyName(key.namespace, describeID(key.id)), h, sym)})
	})
	c.writer.waits(func(h writerHolder, w writerWaiterInfo) {
		out = append(out, inProcessEdge{kind: "sqlite_writer", waiter: ownerConn(w.owner), since: w.since, wsite: w.where,
			holder: h.identity()})
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].since.Before(out[j].since) })
	return out
}

// ownerConn returns the connection of a lock owner.
func ownerConn(owner any) *conn {
	switch o := owner.(type) {
	case *conn:
		return o
	case txOwner:
		return o.c
	case *AdvisoryLock:
		return o.c
	}
	return nil
}

// writerHolder describes the holder of the SQLite writer lock.
type writerHolder struct {
	owner    any
	since    time.Time
	stmt     string            // the autocommit statement holding it, or
	site     callers           // where its transaction began (n == 0: not recorded)
	siteLate bool              // site is that of a later statement of the transaction
	span     trace.SpanContext // the span it took the lock in
}

// identity is the writer lock's holder as every message names it.
func (h *writerHolder) identity() holder {
	x := connHolder(ownerConn(h.owner))
	x.Key, x.Since = "writer", h.since
	switch {
	case h.stmt != "":
		x.Statement, x.running = h.stmt, true
	case h.site.n == 0:
	case h.siteLate:
		x.Site, x.SiteKind = h.site.String(), siteLater
	default:
		x.Site, x.SiteKind = h.site.String(), siteBegan
	}
	return x.withSpan(h.span)
}

// describe says what holds the writer lock, for errors.
func (h *writerHolder) describe() string {
	x := h.identity()
	if x.where() == "" {
		x.Site = "" // "connection #3 …, in a transaction whose call site was not recorded"
		return x.String() + ", in a transaction whose call site was not recorded (lockhooks records where write transactions begin while writers have waited for each other within the last minute, and a waited-for transaction's next statement)"
	}
	return x.String()
}

// location is where the holding transaction is, as a call site.
func (h *writerHolder) location() string {
	switch {
	case h.stmt != "":
		return describeWriter(h.stmt, nil)
	case h.site.n == 0:
		return "not recorded"
	case h.siteLate:
		return h.site.String() + " (a later statement)"
	}
	return h.site.String()
}

// describeWriter returns the statement, or symbolises the call site.
func describeWriter(stmt string, site *callers) string {
	if stmt != "" {
		return "statement " + strconv.Quote(truncate(stmt, 120))
	}
	return site.String()
}

// writerWaiterInfo describes a waiter for the SQLite writer lock.
type writerWaiterInfo struct {
	owner any
	since time.Time
	stmt  string
	site  callers
	where string // the statement, or where its transaction begins
}

// holder returns the writer lock's holder, if it is held.
func (w *writerLock) holder() (writerHolder, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.held {
		return writerHolder{}, false
	}
	return w.holderLocked(), true
}

// waits calls fn for each waiter of the writer lock, after copying them
// under w.mu.
func (w *writerLock) waits(fn func(h writerHolder, wt writerWaiterInfo)) {
	w.mu.Lock()
	if !w.held || len(w.waiters) == 0 {
		w.mu.Unlock()
		return
	}
	h := w.holderLocked()
	waiters := make([]writerWaiterInfo, len(w.waiters))
	for i, x := range w.waiters {
		waiters[i] = writerWaiterInfo{owner: x.owner, since: x.since, stmt: x.stmt, site: x.site}
	}
	w.mu.Unlock()
	for _, x := range waiters {
		x.where = describeWriter(x.stmt, &x.site)
		fn(h, x)
	}
}

// advisoryHolders reads, on a side connection of its own, which backends
// hold (granted) the advisory keys, as holders (connections of a lockhooks
// database of this process) and blockers (the others). It names the holder
// of a wait after the wait ended, when the server no longer shows it.
func (c *connector) advisoryHolders(ctx context.Context, keys []lockKey) ([]holder, []pgBlocker, error) {
	if len(keys) == 0 || c.opts.dialect != Postgres {
		return nil, nil, nil
	}
	var conds []string
	for _, k := range keys {
		classid, objid, sub := k.k1>>32, k.k1&0xffffffff, 1
		if k.pair {
			classid, objid, sub = k.k1&0xffffffff, k.k2&0xffffffff, 2
		}
		conds = append(conds, fmt.Sprintf("(l.classid = %d AND l.objid = %d AND l.objsubid = %d)", classid, objid, sub))
	}
	side, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer side.Close()
	rows, err := queryDirect(ctx, side, `SELECT DISTINCT a.pid::bigint, coalesce(a.application_name, ''), coalesce(a.state, ''),
	coalesce(extract(epoch FROM clock_timestamp() - a.xact_start)::float8, -1), left(coalesce(a.query, ''), 500)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND (`+strings.Join(conds, " OR ")+`)`, nil)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var blockers []pgBlocker
	dest := make([]driver.Value, 5)
	for rows.Next(dest) == nil {
		blockers = append(blockers, pgBlocker{PID: int32(asInt64(dest[0])), ApplicationName: asString(dest[1]), State: asString(dest[2]),
			XactSeconds: asFloat64(dest[3]), Query: asString(dest[4])})
	}
	holders, rest := resolveBlockers(nil, blockers, keys)
	return holders, rest, nil
}

// nameHolder adds to the error of a Postgres lock wait that timed out or
// was cancelled (the context, lock_timeout, statement_timeout) what it
// waited for, how long, and who holds it: as the slow-wait log or the
// lookup before the context's deadline found it, or, for advisory keys,
// as pg_locks shows it now. It still wraps err.
func (c *conn) nameHolder(w *lockWait, err error) error {
	if w == nil || err == nil || errors.Is(err, ErrSelfWait) || errors.Is(err, ErrLockLost) {
		return err
	}
	if o := outcomeOf(err); o != outcomeTimeout && o != outcomeCanceled {
		return err
	}
	waited := time.Since(w.start).Round(time.Millisecond)
	text := w.holderNamed()
	if text == "" && len(w.advKeys) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		holders, blockers, lerr := c.connector.advisoryHolders(ctx, w.advKeys)
		cancel()
		if lerr == nil && len(holders)+len(blockers) > 0 {
			text = describeHolders(holders, blockers, nil)
		}
	}
	what := w.kind + " lock"
	switch {
	case w.namespace != "":
		what += fmt.Sprintf(" %q ids %s", w.namespace, w.keys)
	case w.keys != "":
		what += " " + w.keys
	case w.query != "":
		what += fmt.Sprintf(" for %.120q", w.query)
	}
	if text == "" {
		return fmt.Errorf("lockhooks: gave up waiting for the %s after %v (the holder was not looked up in time): %w", what, waited, err)
	}
	return fmt.Errorf("lockhooks: gave up waiting for the %s after %v; held by %s: %w", what, waited, text, err)
}
