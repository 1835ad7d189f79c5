package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/lockorder"
	"github.com/lockhooks/lockhooks/internal/lockset"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// heldKind is the kind of a lock lockhooks tracks per transaction.
type heldKind uint8

const (
	heldRow      heldKind = iota // rows of a table (FOR [NO KEY] UPDATE; UPDATE and DELETE with the checker on)
	heldAdvisory                 // an advisory key
	heldLockset                  // a Lock namespace
)

// txLock is one lock a transaction (or, for session advisory locks, a
// connection) took, as far as lockhooks can see it. Names are resolved
// lazily from the statement text so that tracking allocates nothing on
// the path every locking statement takes; order and count are filled
// only when the checker is on.
type txLock struct {
	kind heldKind
	text string   // heldRow: the statement as written
	mode string   // heldRow: FOR UPDATE, FOR NO KEY UPDATE, UPDATE, DELETE
	key  lockKey  // heldAdvisory, when keyOK
	expr string   // heldAdvisory: the key expression, when !keyOK
	name string   // heldLockset: the namespace
	ids  []string // heldLockset: canonical ids, sorted

	keyOK bool

	// Lock-order checker only.
	order lockorder.Lock // the lock as the checker sees it
	count int            // session locks: holds of the class (they stack)
}

// Order returns the lock as the lock-order checker sees it.
func (l *txLock) Order() *lockorder.Lock { return &l.order }

// txLocks is a transaction's tracked locks. list[:mark] were taken
// before the statement running now.
type txLocks struct {
	list []txLock
	mark int
}

// reset forgets everything, keeping the slice's memory for the
// connection's next transaction.
func (h *txLocks) reset() {
	clear(h.list)
	h.list, h.mark = h.list[:0], 0
}

// describe names the locks held before the current statement and those
// the current statement asked for.
func (h *txLocks) describe() (held, waiting []string) {
	for i, l := range h.list {
		d := l.describe()
		if i < h.mark {
			held = append(held, d)
		} else {
			waiting = append(waiting, d)
		}
	}
	return held, waiting
}

// describe names the lock for messages.
func (l *txLock) describe() string {
	switch l.kind {
	case heldLockset:
		return fmt.Sprintf("lockset %q ids %s", l.name, lockset.DescribeIDs(l.ids))
	case heldAdvisory:
		if l.keyOK {
			return "advisory key " + l.key.String()
		}
		return "advisory key " + l.expr
	}
	table := sqlscan.LockTarget(l.text, sqlscan.Postgres).Table
	if table == "" {
		table = "a table"
	}
	return "rows of " + table + " (" + l.mode + ")"
}

// beforeStatement runs before every statement of the connection: it marks
// what the transaction held before it, and notes the locks the statement
// asks for when it may ask for any (or the checker wants every UPDATE and
// DELETE).
func (c *conn) beforeStatement(st statement, query string, args []driver.NamedValue) {
	c.tx.held.mark = len(c.tx.held.list)
	if st.rowLock || st.advisory != nil || c.connector.opts.lockOrder != nil {
		c.noteLocks(st, query, args)
	}
}

// noteLocks records the locks a statement is about to ask for: into the
// transaction's list (for DeadlockError), and, with the lock-order checker
// on, into the order graph. Called before the statement runs, because a
// statement that deadlocks still tells the order it asked in.
func (c *conn) noteLocks(st statement, query string, args []driver.NamedValue) {
	t := &c.tx
	inTx := t.inner != nil
	g := c.connector.opts.lockOrder
	if adv := st.advisory; adv != nil {
		if adv.DiscardAll && g != nil {
			c.order.session = c.order.session[:0]
		}
		for _, call := range adv.Calls {
			f := call.Func
			switch {
			case f&sqlscan.FnUnlockAll != 0:
				if g != nil {
					c.order.session = c.order.session[:0]
				}
				continue
			case f&sqlscan.FnTry != 0:
				continue // a try-lock never waits, so it orders nothing
			}
			l := txLock{kind: heldAdvisory}
			l.key, l.keyOK = keyOf(call, args)
			if !l.keyOK {
				l.expr = call.Args[0].Text
			}
			switch {
			case f&sqlscan.FnUnlock != 0:
				if g != nil {
					c.order.unlock(l.advisoryClass())
				}
			case f&sqlscan.FnXact != 0:
				if inTx {
					c.take(l)
				}
			case g != nil:
				c.takeSession(l)
			}
		}
	}
	if !inTx {
		return
	}
	var l txLock
	switch {
	case st.locks&(sqlscan.ForUpdate|sqlscan.ForNoKeyUpdate) != 0:
		l = txLock{kind: heldRow, text: query, mode: "FOR UPDATE"}
		if st.rewrote || st.locks&sqlscan.ForNoKeyUpdate != 0 && st.locks&sqlscan.ForUpdate == 0 {
			l.mode = "FOR NO KEY UPDATE"
		}
	case g != nil:
		switch w := sqlscan.FirstWord(query); {
		case strings.EqualFold(w, "UPDATE"), strings.EqualFold(w, "DELETE"):
			l = txLock{kind: heldRow, text: query, mode: strings.ToUpper(w)}
		default:
			return
		}
	default:
		return
	}
	if g != nil {
		tg := sqlscan.LockTarget(query, c.connector.rewriter.dialect)
		if tg.Table != "" { // else an unknown table: no class, only the record
			l.order.Class = "table " + strings.ToLower(tg.Table)
		}
		if tg.Table != "" && tg.HasKey {
			v, ok := tg.Literal, true
			if tg.Param > 0 {
				v, ok = argInt(args, tg.Param)
			}
			if ok {
				l.order.Column = strings.ToLower(tg.Column)
				l.order.Lo = lockset.IntID(v)
				l.order.Hi = l.order.Lo
			}
		}
	}
	c.take(l)
}

// noteLockset records a lockset request that was granted.
func (c *conn) noteLockset(namespace string, keys []string) {
	if c.tx.inner == nil {
		return
	}
	l := txLock{kind: heldLockset, name: namespace, ids: keys}
	if c.connector.opts.lockOrder != nil {
		l.order.Class = "lockset " + strconv.Quote(namespace)
		l.order.Lo, l.order.Hi = keys[0], keys[len(keys)-1]
	}
	c.take(l)
	c.tx.held.mark = len(c.tx.held.list) // granted: held, not waited for
}

// advisoryClass is the lock class of an advisory key.
func (l *txLock) advisoryClass() string {
	if l.keyOK {
		k := l.key
		k.Shared = false // shared and exclusive holds of a key are one class
		return "advisory key " + k.String()
	}
	return "advisory key " + l.expr
}

// take records a lock of the current transaction and, with the checker
// on, the order it was taken in.
func (c *conn) take(l txLock) {
	t := &c.tx
	t.held.list = append(t.held.list, l) // l itself must not escape: this runs for every tracked lock
	if g := c.connector.opts.lockOrder; g != nil {
		n := len(t.held.list) - 1
		p := &t.held.list[n]
		if p.kind == heldAdvisory {
			p.order.Class = p.advisoryClass()
		}
		if p.order.Class == "" {
			return
		}
		site := new(callsite.Trail)
		site.Capture()
		p.order.Site = site
		c.noteLockOrder(g.graph.Taken(&p.order, c.order.session, t.held.list[:n]))
	}
}

// noteLockOrder hands lock-order reports to the handler, then puts them
// among the database's recent events (the /debug/locks page).
func (c *conn) noteLockOrder(found []lockorder.Report) {
	if len(found) == 0 {
		return
	}
	g := c.connector.opts.lockOrder
	reports := make([]LockOrderReport, len(found))
	for i := range found {
		reports[i] = lockOrderReport(&found[i])
		g.handler(reports[i])
	}
	for _, r := range reports {
		c.connector.events.Add(eventLockOrder, r.String())
	}
}

// takeSession records a session advisory lock for the checker.
func (c *conn) takeSession(l txLock) {
	l.order.Class = l.advisoryClass()
	for i := range c.order.session {
		if c.order.session[i].order.Class == l.order.Class {
			c.order.session[i].count++
			return
		}
	}
	site := new(callsite.Trail)
	site.Capture()
	l.order.Site = site
	l.count = 1
	var tx []txLock
	if c.tx.inner != nil {
		tx = c.tx.held.list
	}
	c.noteLockOrder(c.connector.opts.lockOrder.graph.Taken(&l.order, c.order.session, tx))
	c.order.session = append(c.order.session, l)
}

// connOrder is a connection's state for the lock-order checker: the
// session advisory locks it holds, which order what it takes next in any
// of its transactions.
type connOrder struct {
	session []txLock
}

// unlock drops one hold of a session lock class.
func (o *connOrder) unlock(class string) {
	for i := range o.session {
		if o.session[i].order.Class == class {
			if o.session[i].count--; o.session[i].count <= 0 {
				o.session = slices.Delete(o.session, i, i+1)
			}
			return
		}
	}
}

// LockOrderKind says what a [LockOrderReport] found.
type LockOrderKind int

// What the lock-order checker reports.
const (
	// LockOrderCycle: lock classes were taken in orders that form a cycle
	// (A before B in one place, B before A in another, or longer). Run
	// concurrently, the code paths can deadlock.
	LockOrderCycle LockOrderKind = iota + 1
	// DescendingIDs (a warning): one transaction took ids of one class
	// in descending order by separate calls, e.g. row 2 then row 1 of
	// accounts: the transfer in the other direction takes them ascending,
	// and the two deadlock. Sort the ids and lock them in one call or in
	// ascending order.
	DescendingIDs
	// UnorderedRowLock (a warning): SELECT … FOR UPDATE or FOR NO KEY
	// UPDATE locked more than one row without ORDER BY, so the order the
	// rows are locked in is whatever the plan gives; add ORDER BY on the
	// key.
	UnorderedRowLock
)

// String names the kind of finding.
func (k LockOrderKind) String() string {
	switch k {
	case LockOrderCycle:
		return "lock-order cycle"
	case DescendingIDs:
		return "ids locked in descending order"
	case UnorderedRowLock:
		return "rows locked without ORDER BY"
	}
	return "LockOrderKind(" + strconv.Itoa(int(k)) + ")"
}

// LockOrderEdge is one observed order: some transaction or connection held
// From (taken at FromSite) when it took To (at ToSite). The sites are
// those of the first time the order was seen.
type LockOrderEdge struct {
	From, To         string
	FromSite, ToSite string
}

// LockOrderReport is what the lock-order checker found; see
// [WithLockOrderCheck].
type LockOrderReport struct {
	Kind LockOrderKind
	// Classes are the lock classes involved: the cycle's, in order (each
	// taken before the next, the last before the first), or the one class
	// of a warning. A class is "table <name>", "lockset \"<namespace>\"" or
	// "advisory key <key>".
	Classes []string
	// Edges are a cycle's orders with the call sites that took them, one
	// per consecutive pair of Classes (the last closing the cycle).
	Edges []LockOrderEdge
	// Site is where a warning's lock was taken; Earlier is where the
	// higher id was taken (DescendingIDs).
	Site, Earlier string
	// Detail says what a warning saw (the ids, the row count).
	Detail string
}

// String names every class and the call sites of every order.
func (r LockOrderReport) String() string {
	var b strings.Builder
	switch r.Kind {
	case LockOrderCycle:
		fmt.Fprintf(&b, "lockhooks: lock-order cycle between %s:", strings.Join(r.Classes, ", "))
		for _, e := range r.Edges {
			fmt.Fprintf(&b, "\n  %s (taken at %s) then %s (taken at %s)", e.From, e.FromSite, e.To, e.ToSite)
		}
		b.WriteString("\nthese code paths take the same locks in different orders and deadlock when they run concurrently; take them in one global order")
	case DescendingIDs:
		fmt.Fprintf(&b, "lockhooks: %s ids locked in descending order: %s at %s after a higher id at %s; lock ids in ascending order (sort them, or pass them all to one Lock call) so that concurrent transactions cannot deadlock",
			strings.Join(r.Classes, ", "), r.Detail, r.Site, r.Earlier)
	case UnorderedRowLock:
		fmt.Fprintf(&b, "lockhooks: %s: %s at %s without ORDER BY; rows are locked in the order the plan returns them, which can differ between transactions: add ORDER BY on the key",
			strings.Join(r.Classes, ", "), r.Detail, r.Site)
	default:
		fmt.Fprintf(&b, "lockhooks: %v %s", r.Kind, strings.Join(r.Classes, ", "))
	}
	return b.String()
}

// WithLockOrderCheck turns on the lock-order checker: lockhooks' version of
// the Linux kernel's lockdep, for database locks. It is off by default and
// meant for tests and staging; when off it costs nothing.
//
// Per transaction, and per connection for session advisory locks, the
// checker records the order in which lock classes are first taken — a
// [Lock] namespace, an advisory key, the table of a SELECT … FOR [NO KEY]
// UPDATE or of an UPDATE or DELETE — into one order graph. When a new
// order closes a cycle of any length, handler is called once for that
// cycle with a report that names every class and the call sites of every
// order, even if the code never actually deadlocked: one sequential test
// run that exercises both code paths is enough. It also reports, as
// warnings, ids of one class taken in descending order by separate calls
// within a transaction (ids come from Lock, and from "WHERE key = $n" or a
// literal in a row-locking statement), and FOR UPDATE / FOR NO KEY UPDATE
// that locked more than one row without ORDER BY. Each warning is reported
// once per call site. Try-locks never wait and order nothing. Locks are
// recorded when their statement is sent (a statement that deadlocks still
// shows its order), so a session advisory lock whose statement failed
// counts as held until its unlock or DISCARD ALL; locks taken inside
// server-side functions and triggers are not seen.
//
// The graph belongs to the returned Option: every database opened with
// the same Option value shares one graph (pass it to several Open calls
// to check order across them, as the process-wide lockdep does); each
// call of WithLockOrderCheck starts a new, empty graph. handler runs on
// the goroutine whose statement closed the cycle; it may use the
// database. Rows of a checked row-locking query lose the driver's
// optional column-type interfaces (they are counted), which only matters
// to code that calls Rows.ColumnTypes on them.
func WithLockOrderCheck(handler func(LockOrderReport)) Option {
	var g *lockOrder
	if handler != nil {
		g = &lockOrder{graph: lockorder.New[txLock](lockset.DescribeID), handler: handler}
	}
	return func(o *options) { o.lockOrder = g }
}

// lockOrder is the lock-order checker of one WithLockOrderCheck Option:
// the order graph of every database opened with it, and the handler of
// its reports.
type lockOrder struct {
	graph   *lockorder.Graph[txLock, *txLock]
	handler func(LockOrderReport)
}

// lockOrderReport is the exported form of a report of the graph.
func lockOrderReport(r *lockorder.Report) LockOrderReport {
	out := LockOrderReport{Classes: r.Classes, Site: r.Site, Earlier: r.Earlier, Detail: r.Detail}
	switch r.Kind {
	case lockorder.Cycle:
		out.Kind = LockOrderCycle
	case lockorder.DescendingIDs:
		out.Kind = DescendingIDs
	case lockorder.UnorderedRows:
		out.Kind = UnorderedRowLock
	}
	if r.Edges != nil {
		out.Edges = make([]LockOrderEdge, len(r.Edges))
		for i, e := range r.Edges {
			out.Edges[i] = LockOrderEdge{From: e.From, To: e.To, FromSite: e.FromSite, ToSite: e.ToSite}
		}
	}
	return out
}

// watchRowLock counts the rows of a FOR UPDATE / FOR NO KEY UPDATE query
// without ORDER BY, to warn when it locked more than one.
func (c *conn) watchRowLock(ctx context.Context, query string, rows driver.Rows) driver.Rows {
	st := c.intercept(ctx, query)
	if st.locks&(sqlscan.ForUpdate|sqlscan.ForNoKeyUpdate) == 0 {
		return rows
	}
	tg := sqlscan.LockTarget(query, c.connector.rewriter.dialect)
	if tg.OrderBy || tg.Table == "" {
		return rows
	}
	r := &countedRows{Rows: rows, check: c.connector.opts.lockOrder, class: "table " + strings.ToLower(tg.Table), site: new(callsite.Trail)}
	r.site.Capture()
	return r
}

// countedRows counts the rows of a row-locking query.
type countedRows struct {
	driver.Rows
	check *lockOrder
	class string
	site  *callsite.Trail
	n     int
}

func (r *countedRows) Next(dest []driver.Value) error {
	err := r.Rows.Next(dest)
	if err == nil {
		r.n++
	}
	return err
}

func (r *countedRows) Close() error {
	err := r.Rows.Close()
	if r.n > 1 {
		if found, ok := r.check.graph.Unordered(r.class, r.site, r.n); ok {
			r.check.handler(lockOrderReport(&found))
		}
		r.n = 0
	}
	return err
}
