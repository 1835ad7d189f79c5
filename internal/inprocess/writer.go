package inprocess

import (
	"strconv"
	"time"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/sqlitelock"
)

// Writer is a database's SQLite writer lock (see sqlitelock.Writer), taken
// by [Taker]s.
type Writer = sqlitelock.Writer[Taker]

// WriterHolder describes the holder of the SQLite writer lock.
type WriterHolder struct {
	sqlitelock.WriterHolder[Taker]
}

// WriterHolderOf returns w's holder, if it is held.
func WriterHolderOf(w *Writer) (WriterHolder, bool) {
	h, ok := w.Holder()
	return WriterHolder{h}, ok
}

// Identity is the writer lock's holder as every message names it.
func (h *WriterHolder) Identity(o Owners) holders.Holder {
	x := o(h.Owner)
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
	return x.WithSpan(h.Taker.Span)
}

// Describe says what holds the writer lock, for errors.
func (h *WriterHolder) Describe(o Owners) string {
	x := h.Identity(o)
	if x.Where() == "" {
		x.Site = "" // "connection #3 …, in a transaction whose call site was not recorded"
		return x.String() + ", in a transaction whose call site was not recorded (lockhooks records where write transactions begin while writers have waited for each other within the last minute, and a waited-for transaction's next statement)"
	}
	return x.String()
}

// Location is where the holding transaction is, as a call site.
func (h *WriterHolder) Location() string {
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

// WriterWaiter describes a waiter for the SQLite writer lock.
type WriterWaiter struct {
	Owner any
	Since time.Time
	Stmt  string
	Site  callsite.Stack
	Where string // the statement, or where its transaction begins
}

// WriterWaits calls fn for each waiter of w and the holder it waits for,
// after copying them under the lock's mutex.
func WriterWaits(w *Writer, fn func(h WriterHolder, wt WriterWaiter)) {
	w.Waits(func(h sqlitelock.WriterHolder[Taker], x sqlitelock.WriterWaiting) {
		fn(WriterHolder{h}, WriterWaiter{Owner: x.Owner, Since: x.Since, Stmt: x.Stmt, Site: x.Site, Where: describeWriter(x.Stmt, &x.Site)})
	})
}
