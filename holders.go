package lockhooks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockhooks/lockhooks/internal/identity"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
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
	mu   sync.RWMutex
	dbs  []*connector
	next uint64 // the number of the last database opened (connector.seq)
}

// databases is the process's registry.
var databases registry

// join registers c, numbers it and settles its pool name: the one WithPoolName gave,
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
	r.next++
	c.seq = r.next
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

// connOf returns the connection of any open Postgres database of the
// process whose statements backend pid runs, as pg_stat_activity shows
// the backend (its application_name app and last statement query) to
// database seenBy, or nil (see connector.backendConn). Pids are per
// server: a backend that shows no identity is matched only to connections
// of seenBy and of databases known to be on the same server.
func (r *registry) connOf(pid int32, app, query string, seenBy *connector) *conn {
	if pid == 0 {
		return nil
	}
	for _, c := range r.list() {
		if c.opts.dialect != Postgres {
			continue
		}
		if oc := c.backendConn(pid, app, query, c.index(), sameServer(c, seenBy)); oc != nil {
			return oc
		}
	}
	return nil
}

// sameServer reports whether databases a and b are known to reach the
// same Postgres server, where a backend pid names the same backend.
func sameServer(a, b *connector) bool {
	if a == b {
		return a != nil
	}
	if a == nil || b == nil {
		return false
	}
	sa, sb := a.server.Load(), b.server.Load()
	return sa != nil && sb != nil && *sa != "" && *sa == *sb
}

// What a holder's Site is (holder.SiteKind).
const (
	siteNone  = ""
	siteTook  = "took_lock"         // where it took the lock
	siteBegan = "began_transaction" // where its transaction began
	siteLater = "later_statement"   // where its transaction ran a later statement
)

// holder is one holder of a lock someone waits for: the identity every
// consumer shows (the page's JSON, errors, log lines, span attributes). It
// is a connection of a lockhooks database of this process, with all the
// model knows of it, or of another process, as that process published it
// in what Postgres shows every session (pg_identity.go).
type holder struct {
	Process   string    `json:"process,omitempty"`  // host/pid:nonce of the holder's process, when it is another process
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
	// In a chain of waits on the server (A holds, C waits for A, the
	// waiter waits behind C): 1 blocks the waiter, 2 blocks a backend that
	// does, and so on (0: found in this process's lock tables). A holder
	// that waits itself (C) is queued ahead of the waiter, not the holder
	// at the root: Statement is what it waits in, for WaitSeconds.
	Depth       int     `json:"depth,omitempty"`
	Queued      bool    `json:"queued,omitempty"`
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	running     bool    // Statement is what holds the lock (an autocommit statement), not the last one
	dbNum       uint64  // another process's number for its database, when it published no pool name
	span        trace.SpanContext
}

// debugHolder is a holder as the debug page's waiters list it: a
// connection of any lockhooks database, here or in another process;
// blocking backends nobody identified are the waiters' Blockers.
type debugHolder = holder

func (h holder) age() time.Duration {
	if h.Since.IsZero() {
		return 0
	}
	return time.Since(h.Since).Round(time.Millisecond)
}

// who is the holder's connection: `connection #3 of "orders" (backend pid
// 812)`, `connection #3 of "orders" in process web-7/4711 (backend pid
// 812)`.
func (h holder) who() string {
	var b strings.Builder
	if h.Conn != 0 {
		fmt.Fprintf(&b, "connection #%d", h.Conn)
	} else {
		b.WriteString("a connection")
	}
	switch {
	case h.Database != "":
		fmt.Fprintf(&b, " of %q", h.Database)
	case h.dbNum != 0:
		fmt.Fprintf(&b, " of database %d", h.dbNum)
	}
	if h.Process != "" {
		b.WriteString(" in process " + h.Process)
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
// took the lock or began its transaction, for how long, and its trace; a
// queued one, what it waits in and for how long.
func (h holder) String() string {
	parts := []string{h.who()}
	if w := h.where(); w != "" {
		parts = append(parts, w)
	}
	if h.Queued {
		s := "waiting"
		if h.WaitSeconds > 0 {
			s += fmt.Sprintf(" %.1fs", h.WaitSeconds)
		}
		if h.Statement != "" {
			s += fmt.Sprintf(" in %.120q", h.Statement)
		}
		return strings.Join(append(parts, s), ", ")
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
	if h.Process != "" {
		args = append(args, "holder_process", h.Process)
	}
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
		attrs = append(attrs, AttrHolderSince.String(h.Since.UTC().Format(time.RFC3339Nano)),
			AttrHolderHeldSeconds.Float64(time.Since(h.Since).Round(time.Millisecond).Seconds()))
	}
	if h.PID != 0 {
		attrs = append(attrs, AttrHolderPID.Int64(int64(h.PID)))
	}
	if h.Process != "" {
		attrs = append(attrs, AttrHolderProcess.String(h.Process))
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

// same reports whether h and o are the same connection.
func (h holder) same(o holder) bool {
	return h.Conn == o.Conn && h.Database == o.Database && h.Process == o.Process && h.dbNum == o.dbNum
}

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holder {
	if oc == nil {
		return holder{}
	}
	return holder{Database: oc.connector.pool, Conn: oc.id, PID: oc.shownPID()}
}

// blockage is who holds what a wait waits for, as the model names it:
// the holders (connections of lockhooks databases, here or in other
// processes), the backends nobody identified, and what the server showed.
// The slow-wait log, errors, spans and the page only format it.
type blockage struct {
	holders  []holder    // the holders at the root first, then those queued ahead of the wait
	blockers []pgBlocker // backends no lockhooks identified, the root first
	server   []pgBlocker // every backend of the chain, as Postgres showed it (nil: not read)
	queued   int         // how many backends block the wait directly while waiting themselves, listed in server or not (maxQueuedListed)
	err      error       // reading the server failed
	at       time.Time   // when it was read
}

// empty reports whether nobody was found.
func (b *blockage) empty() bool { return b == nil || len(b.holders)+len(b.blockers) == 0 }

// add identifies the backends Postgres showed blocking a wait for keys:
// each one that is a connection of a lockhooks database becomes a holder
// (unless already named), the others stay blockers; holders at the root
// come before queued ones.
func (b *blockage) add(server []pgBlocker, keys []lockKey) {
	b.server = append(b.server, server...)
	for _, s := range server {
		h, ok := identify(s, keys)
		if !ok {
			b.blockers = append(b.blockers, s)
			continue
		}
		if !slices.ContainsFunc(b.holders, h.same) {
			b.holders = append(b.holders, h)
		}
	}
	sort.SliceStable(b.holders, func(i, j int) bool { return !b.holders[i].Queued && b.holders[j].Queued })
	sort.SliceStable(b.blockers, func(i, j int) bool { return !b.blockers[i].Waiting && b.blockers[j].Waiting })
}

// root is the holder at the root, the first one not queued.
func (b *blockage) root() (holder, bool) {
	for _, h := range b.holders {
		if !h.Queued {
			return h, true
		}
	}
	return holder{}, false
}

// rootBlocker is the first blocker not waiting itself.
func (b *blockage) rootBlocker() (pgBlocker, bool) {
	for _, x := range b.blockers {
		if !x.Waiting {
			return x, true
		}
	}
	return pgBlocker{}, false
}

// aged is b with the ages the server gave brought up to now (the holders'
// ages count from their Since).
func (b *blockage) aged() *blockage {
	d := time.Since(b.at).Seconds()
	out := *b
	out.holders = slices.Clone(b.holders)
	for i := range out.holders {
		if out.holders[i].Queued && out.holders[i].WaitSeconds > 0 {
			out.holders[i].WaitSeconds += d
		}
	}
	out.blockers = slices.Clone(b.blockers)
	for i := range out.blockers {
		out.blockers[i] = out.blockers[i].aged(d)
	}
	return &out
}

// String is the holder part of a slow-wait line or an error: the holders
// at the root, then the backends queued ahead of the wait.
func (b *blockage) String() string {
	var parts, queued []string
	for _, h := range b.holders {
		if h.Queued {
			queued = append(queued, h.String())
		} else {
			parts = append(parts, h.String())
		}
	}
	for _, x := range b.blockers {
		if x.Waiting {
			queued = append(queued, x.String())
		} else {
			parts = append(parts, x.String())
		}
	}
	if len(queued) > 0 {
		parts = append(parts, "queued ahead of this wait, waiting too: "+strings.Join(queued, "; "))
	}
	if n := b.queuedUnlisted(); n > 0 {
		parts = append(parts, fmt.Sprintf("and %d more queued ahead (not listed)", n))
	}
	if b.err != nil {
		parts = append(parts, "(reading pg_blocking_pids failed: "+b.err.Error()+")")
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, "; ")
}

// queuedUnlisted is how many of the backends queued ahead of the wait
// the server's read counted but did not list (maxQueuedListed).
func (b *blockage) queuedUnlisted() int {
	n := b.queued
	for _, s := range b.server {
		if s.Waiting && s.Depth == 1 {
			n--
		}
	}
	return max(n, 0)
}

// logArgs are the slow-wait line's attributes of the holder at the root,
// the backends nobody identified that block the wait directly
// (blocking_pids) and the backends queued ahead (queued_pids).
func (b *blockage) logArgs() []any {
	text := b.String()
	var args []any
	if h, ok := b.root(); ok {
		args = h.logArgs()
		if len(b.holders) > 1 || len(b.blockers) > 0 {
			args = append(args, "holders", text)
		}
	} else {
		args = []any{"holder", text}
		if x, ok := b.rootBlocker(); ok {
			args = append(args, "holder_pid", x.PID)
			if x.XactSeconds >= 0 {
				args = append(args, "holder_age", time.Duration(x.XactSeconds*float64(time.Second)).Round(time.Millisecond).String())
			}
		}
	}
	var direct, queued []string
	for _, x := range b.blockers {
		if x.Depth <= 1 {
			direct = append(direct, strconv.Itoa(int(x.PID)))
		}
	}
	for _, s := range b.server {
		if s.Waiting {
			queued = append(queued, strconv.Itoa(int(s.PID)))
		}
	}
	if len(direct) > 0 {
		args = append(args, "blocking_pids", strings.Join(direct, ","))
	}
	if len(queued) > 0 {
		args = append(args, "queued_pids", strings.Join(queued, ","))
	}
	return args
}

// identify returns the holder that backend s is, when it is a connection
// of a lockhooks database: of this process (all the model knows of it:
// the lock among keys it holds, where and when it took it, or its
// transaction), or of another (as it published itself). ok is false for a
// backend nobody identified.
func identify(s pgBlocker, keys []lockKey) (h holder, ok bool) {
	id := identity.Decode(s.ApplicationName, s.Query)
	ownStatement := id != nil && identity.ParseAnnotation(s.Query) != nil // lockhooks' own read, not the application's
	switch oc := databases.connOf(s.PID, s.ApplicationName, s.Query, s.seenBy); {
	case oc != nil:
		h = oc.asHolder(keys)
		if h.SiteKind != siteTook && !ownStatement {
			// The last statement of a transaction tells where it is; that of
			// a session-lock holder is often lockhooks' own pg_locks read.
			h.Statement = s.Query
		}
	case id != nil:
		h = holderOf(id)
		if h.SiteKind == siteTook && h.Since.IsZero() && ownStatement && s.State != "active" && s.stateSeconds > 0 {
			// Its last statement is the lock statement that took the lock,
			// which names no since (annotatedLockText): held since that
			// statement ended.
			h.Since = time.Now().Add(-time.Duration(s.stateSeconds * float64(time.Second)))
		}
		if id.OfThisProcess() {
			h.Process = "" // a connection closed since
		}
		if h.SiteKind != siteTook && !ownStatement {
			h.Statement = s.Query
		}
	default:
		return holder{}, false
	}
	h.PID, h.State, h.Depth = s.PID, s.State, s.Depth
	if s.Waiting {
		h.Queued, h.WaitSeconds, h.Statement = true, s.WaitSeconds, s.Query
	}
	if h.Since.IsZero() && s.XactSeconds >= 0 {
		h.Since = time.Now().Add(-time.Duration(s.XactSeconds * float64(time.Second)))
	}
	return h, true
}

// txIdent is a connection's open transaction as other goroutines see it:
// when and where it began, its span and the context it was begun with. The
// transaction's own state (tx) belongs to the connection's goroutine; this
// copy is guarded by mu.
type txIdent struct {
	g     atomic.Uintptr // the goroutine that began it (callsite.CurrentGoroutine), for self-waits
	mu    sync.Mutex
	open  bool
	since time.Time
	site  callsite.Stack
	span  trace.SpanContext
	ctx   context.Context
}

// set records that a transaction began with ctx at site (nil: not
// recorded).
func (t *txIdent) set(ctx context.Context, since time.Time, site *callsite.Stack) {
	t.g.Store(callsite.CurrentGoroutine())
	t.mu.Lock()
	t.open, t.since, t.ctx = true, since, ctx
	t.span = trace.SpanContextFromContext(ctx)
	if site != nil {
		t.site = *site
	} else {
		t.site.Reset()
	}
	t.mu.Unlock()
}

// clear records that the transaction ended.
func (t *txIdent) clear() {
	t.g.Store(0)
	t.mu.Lock()
	t.open, t.ctx = false, nil
	t.site.Reset()
	t.mu.Unlock()
}

// snapshot returns the transaction's identity, if one is open.
func (t *txIdent) snapshot() (since time.Time, site callsite.Stack, span trace.SpanContext, ctx context.Context, open bool) {
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
		if site.Recorded() {
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
// the backends pg_blocking_pids names, followed to the root of the chain,
// each identified where it is a connection of a lockhooks database (of
// this process or another), or, for a wait that does not wait on the
// server (through a transaction pooler lockhooks polls), the backends
// pg_locks shows holding its advisory keys.
func (c *connector) holdersOf(ctx context.Context, v waitView) *blockage {
	b := &blockage{holders: c.inProcessHolders(v, c.inProcessEdges()), at: time.Now()}
	if c.opts.dialect != Postgres || v.conn == nil || v.conn.pid.Load() == 0 {
		return b
	}
	ahead := c.turnAhead(v.conn)
	asked := []*conn{v.conn}
	if ahead != nil {
		asked = append(asked, ahead)
	}
	blocked, err := c.blockedConns(ctx, asked)
	bb := blocked[v.conn]
	if bb == nil && ahead != nil && blocked[ahead] != nil {
		bb = blocked[ahead].behindInMemory()
	}
	switch {
	case err != nil:
		b.err = err
	case bb != nil:
		b.add(bb.blockers, v.advKeys)
		b.queued = bb.queuedAhead
	case len(b.holders) == 0 && len(v.advKeys) > 0:
		b.add(c.keyHolders(ctx, v.conn, v.advKeys), v.advKeys)
	}
	return b // otherwise not waiting on the server (an in-process queue)
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
	if h.site.Recorded() {
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
	c.turns.waits(func(key int64, h holderInfo, w waiterInfo) { // the in-process queue of advisory keys (Postgres)
		if o, ok := h.owner.(*conn); ok && o.awaitsOnServer(key) {
			return // the turn's owner waits itself: the key's holder is whom the server names for it (turnAhead)
		}
		named(key, h, w)
	})
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
	site     callsite.Stack    // where its transaction began (empty: not recorded)
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
	case !h.site.Recorded():
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
	case !h.site.Recorded():
		return "not recorded"
	case h.siteLate:
		return h.site.String() + " (a later statement)"
	}
	return h.site.String()
}

// describeWriter returns the statement, or symbolises the call site.
func describeWriter(stmt string, site *callsite.Stack) string {
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
	site  callsite.Stack
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

// nameHolder adds to the error of a Postgres lock wait that timed out or
// was cancelled (the context, lock_timeout, statement_timeout) what it
// waited for, how long, and who holds it: as the slow-wait log, the wait
// span's blockers read or the lookup before the context's deadline found
// it (whichever came first, with its ages now), or, for advisory keys, as
// pg_locks shows it now. It still wraps err.
func (c *conn) nameHolder(w *lockWait, err error) error {
	if w == nil || err == nil || errors.Is(err, ErrSelfWait) || errors.Is(err, ErrLockLost) {
		return err
	}
	if o := outcomeOf(err); o != outcomeTimeout && o != outcomeCanceled {
		return err
	}
	waited := time.Since(w.start).Round(time.Millisecond)
	text := w.holderNamed()
	if text == "" && len(w.advKeys) > 0 && c.connector.opts.dialect == Postgres {
		// Nobody looked in time; the keys' holders, as pg_locks shows them
		// now (the server forgot the wait).
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		b := &blockage{at: time.Now()}
		b.add(c.connector.keyHolders(ctx, c, w.advKeys), w.advKeys)
		cancel()
		if !b.empty() {
			text = b.String()
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
