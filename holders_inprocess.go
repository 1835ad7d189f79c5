package lockhooks

// Holders in this process: a transaction's identity, a connection as a holder,
// the connections that hold a key (pinned session locks, lockset tables, the
// SQLite writer lock), and the error that names them.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

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
func (oc *conn) asHolder(keys []lockKey) holders.Holder {
	h := connHolder(oc)
	if oc.connector.pins != nil {
		oc.pin.Lock()
		for _, k := range keys {
			for _, hk := range conflicting(k) {
				if l := oc.pin.Held[hk]; l != nil && h.SiteKind == holders.SiteNone {
					h.Key, h.Site, h.Since, h.SiteKind = hk.String(), l.Site, l.Since, holders.SiteTook
					h = h.WithSpan(l.Span)
				}
			}
		}
		oc.pin.Unlock()
		if h.SiteKind != holders.SiteNone {
			return h
		}
	}
	since, site, span, _, open := oc.ident.snapshot()
	if open {
		h.Since, h.SiteKind = since, holders.SiteBegan
		if site.Recorded() {
			h.Site = site.String()
		}
		h = h.WithSpan(span)
	}
	return h
}

// conflicting returns the modes of k's key that conflict with a request
// for k: both for an exclusive request, the exclusive one for a shared.
func conflicting(k lockKey) []lockKey {
	ex := k.exclusive()
	if k.Shared {
		return []lockKey{ex}
	}
	return []lockKey{ex, lockKey(advisorykey.Key(k).SharedMode())}
}

// holdersOf finds who holds what the wait v waits for: in-process holders
// from the lock tables and the advisory-lock tracking and, on Postgres,
// the backends pg_blocking_pids names, followed to the root of the chain,
// each identified where it is a connection of a lockhooks database (of
// this process or another), or, for a wait that does not wait on the
// server (through a transaction pooler lockhooks polls), the backends
// pg_locks shows holding its advisory keys.
func (c *connector) holdersOf(ctx context.Context, v waitView) *holders.Blockage {
	b := &holders.Blockage{Holders: c.inProcessHolders(v, c.inProcessEdges()), At: time.Now()}
	if c.opts.dialect != Postgres || v.Waiter == nil || v.Waiter.pin.PID.Load() == 0 {
		return b
	}
	ahead := c.turnAhead(v.Waiter)
	asked := []*conn{v.Waiter}
	if ahead != nil {
		asked = append(asked, ahead)
	}
	blocked, err := c.blocking.Blocked(ctx, asked)
	bb := blocked[v.Waiter]
	if bb == nil && ahead != nil && blocked[ahead] != nil {
		bb = blocked[ahead].BehindInMemory()
	}
	switch {
	case err != nil:
		b.Err = err
	case bb != nil:
		addBlockers(b, bb.Blockers, v.AdvKeys)
		b.Queued = bb.QueuedAhead
	case len(b.Holders) == 0 && len(v.AdvKeys) > 0:
		addBlockers(b, c.keyHolders(ctx, v.Waiter, v.AdvKeys), v.AdvKeys)
	}
	return b // otherwise not waiting on the server (an in-process queue)
}

// inProcessHolders returns the holders in this process of what v waits
// for: from the lock tables' edges, and from the advisory-lock tracking.
func (c *connector) inProcessHolders(v waitView, edges []inProcessEdge) []holders.Holder {
	holders := []holders.Holder{}
	if v.Waiter == nil {
		return holders
	}
	for _, e := range edges {
		if e.waiter == v.Waiter {
			holders = append(holders, e.holder)
		}
	}
	if c.pins != nil {
		for _, k := range v.AdvKeys {
			holders = append(holders, c.pinHolders(k, v.Waiter)...)
		}
	}
	return holders
}

// pinHolders returns the connections other than except that hold k or a
// session lock that conflicts with it.
func (c *connector) pinHolders(k lockKey, except *conn) []holders.Holder {
	var out []holders.Holder
	for _, h := range c.pins.Snapshot() {
		if h == except {
			continue
		}
		h.pin.Lock()
		for _, hk := range conflicting(k) {
			if l := h.pin.Held[hk]; l != nil {
				x := connHolder(h)
				x.Key, x.Site, x.Since, x.SiteKind = hk.String(), l.Site, l.Since, holders.SiteTook
				out = append(out, x.WithSpan(l.Span))
			}
		}
		h.pin.Unlock()
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
	holder holders.Holder
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
func tableHolder(key string, h holderInfo) holders.Holder { return tableHolderNamed(key, h, nil) }

// tableHolderNamed is tableHolder with the call sites symbolised through
// sym, when not nil (a page or a list of many waiters shares sites).
func tableHolderNamed(key string, h holderInfo, sym siteNames) holders.Holder {
	x := connHolder(ownerConn(h.owner))
	x.Key, x.Since, x.SiteKind = key, h.since, holders.SiteTook
	if h.site.Recorded() {
		if sym != nil {
			x.Site = sym.of(&h.site)
		} else {
			x.Site = h.site.String()
		}
	}
	return x.WithSpan(h.span)
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
			holder: tableHolderNamed(lockKeyName(key.namespace, lockset.DescribeID(key.id)), h, sym)})
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
	sqlitelock.WriterHolder[lockTaker]
}

// identity is the writer lock's holder as every message names it.
func (h *writerHolder) identity() holders.Holder {
	x := connHolder(ownerConn(h.Owner))
	x.Key, x.Since = "writer", h.Since
	switch {
	case h.Stmt != "":
		x.Statement, x.Running = h.Stmt, true
	case !h.Site.Recorded():
	case h.SiteLate:
		x.Site, x.SiteKind = h.Site.String(), holders.SiteLater
	default:
		x.Site, x.SiteKind = h.Site.String(), holders.SiteBegan
	}
	return x.WithSpan(h.Taker.span)
}

// describe says what holds the writer lock, for errors.
func (h *writerHolder) describe() string {
	x := h.identity()
	if x.Where() == "" {
		x.Site = "" // "connection #3 …, in a transaction whose call site was not recorded"
		return x.String() + ", in a transaction whose call site was not recorded (lockhooks records where write transactions begin while writers have waited for each other within the last minute, and a waited-for transaction's next statement)"
	}
	return x.String()
}

// location is where the holding transaction is, as a call site.
func (h *writerHolder) location() string {
	switch {
	case h.Stmt != "":
		return describeWriter(h.Stmt, nil)
	case !h.Site.Recorded():
		return "not recorded"
	case h.SiteLate:
		return h.Site.String() + " (a later statement)"
	}
	return h.Site.String()
}

// describeWriter returns the statement, or symbolises the call site.
func describeWriter(stmt string, site *callsite.Stack) string {
	if stmt != "" {
		return "statement " + strconv.Quote(holders.Truncate(stmt, 120))
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
	h, ok := w.core.Holder()
	return writerHolder{h}, ok
}

// waits calls fn for each waiter of the writer lock, after copying them
// under the lock's mutex.
func (w *writerLock) waits(fn func(h writerHolder, wt writerWaiterInfo)) {
	w.core.Waits(func(h sqlitelock.WriterHolder[lockTaker], x sqlitelock.WriterWaiting) {
		fn(writerHolder{h}, writerWaiterInfo{owner: x.Owner, since: x.Since, stmt: x.Stmt, site: x.Site, where: describeWriter(x.Stmt, &x.Site)})
	})
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
	if o := outcomeOf(err); o != telemetry.OutcomeTimeout && o != telemetry.OutcomeCanceled {
		return err
	}
	waited := time.Since(w.Started()).Round(time.Millisecond)
	text := w.holderNamed()
	if text == "" && len(w.AdvisoryKeys()) > 0 && c.connector.opts.dialect == Postgres {
		// Nobody looked in time; the keys' holders, as pg_locks shows them
		// now (the server forgot the wait).
		ctx, cancel := context.WithTimeout(context.Background(), blockerLookupTimeout)
		b := &holders.Blockage{At: time.Now()}
		addBlockers(b, c.connector.keyHolders(ctx, c, w.AdvisoryKeys()), w.AdvisoryKeys())
		cancel()
		if !b.Empty() {
			text = b.String()
		}
	}
	what := w.Kind() + " lock"
	switch {
	case w.Namespace() != "":
		what += fmt.Sprintf(" %q ids %s", w.Namespace(), w.Keys())
	case w.Keys() != "":
		what += " " + w.Keys()
	case w.Query() != "":
		what += fmt.Sprintf(" for %.120q", w.Query())
	}
	if text == "" {
		return fmt.Errorf("lockhooks: gave up waiting for the %s after %v (the holder was not looked up in time): %w", what, waited, err)
	}
	return fmt.Errorf("lockhooks: gave up waiting for the %s after %v; held by %s: %w", what, waited, text, err)
}
