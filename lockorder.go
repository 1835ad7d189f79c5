package lockhooks

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/lockorder"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
)

// beforeStatement runs before every statement of the connection: it marks
// what the transaction held before it, and notes the locks the statement
// asks for when it may ask for any (or the checker wants every UPDATE and
// DELETE).
func (c *conn) beforeStatement(st statement, query string, args []driver.NamedValue) {
	c.tx.held.Mark()
	if st.rowLock || st.advisory != nil || c.connector.opts.lockOrder != nil {
		c.noteLocks(st, query, args)
	}
}

// noteLocks records the locks a statement is about to ask for: into the
// transaction's list (for DeadlockError), and, with the lock-order checker
// on, into the order graph (stmtlocks.Note).
func (c *conn) noteLocks(st statement, query string, args []driver.NamedValue) {
	var tx *stmtlocks.Tx
	if c.tx.inner != nil {
		tx = &c.tx.held
	}
	stmtlocks.Note(stmtlocks.Statement{Text: query, Args: args, Advisory: st.advisory, Locks: st.locks, Rewrote: st.rewrote, Dialect: c.connector.rewriter.dialect},
		tx, &c.order, c.orderChecker(), (*orderReporter)(c))
}

// noteLockset records a lockset request that was granted.
func (c *conn) noteLockset(namespace string, keys []string) {
	if c.tx.inner == nil {
		return
	}
	stmtlocks.NoteLockset(namespace, keys, &c.tx.held, &c.order, c.orderChecker(), (*orderReporter)(c))
}

// orderChecker is the lock-order checker, nil when it is off.
func (c *conn) orderChecker() *stmtlocks.Checker {
	if g := c.connector.opts.lockOrder; g != nil {
		return g.checker
	}
	return nil
}

// orderReporter is a connection as the stmtlocks.Reporter of its
// statements' lock-order findings.
type orderReporter conn

// LockOrder hands lock-order reports to the handler, then puts them among
// the database's recent events (the /debug/locks page).
func (r *orderReporter) LockOrder(found []lockorder.Report) {
	c := (*conn)(r)
	g := c.connector.opts.lockOrder
	reports := make([]LockOrderReport, len(found))
	for i := range found {
		reports[i] = lockOrderReport(&found[i])
		g.handler(reports[i])
	}
	for _, r := range reports {
		c.connector.Events.Add(eventLockOrder, r.String())
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
		g = &lockOrder{checker: stmtlocks.NewChecker(describeKey), handler: handler}
	}
	return func(o *options) { o.lockOrder = g }
}

// lockOrder is the lock-order checker of one WithLockOrderCheck Option:
// the order graph of every database opened with it, and the handler of
// its reports.
type lockOrder struct {
	checker *stmtlocks.Checker
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
		if found, ok := r.check.checker.Unordered(r.class, r.site, r.n); ok {
			r.check.handler(lockOrderReport(&found))
		}
		r.n = 0
	}
	return err
}
