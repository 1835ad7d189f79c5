package lockhooks

import (
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lockhooks/lockhooks/internal/holders"
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
//
// The value, and how every consumer formats it, is package
// internal/holders; this file builds it from the root's connections
// (connHolder) and gives its span attributes (holderSpanAttrs), whose keys
// are the root's exported ones.

// holderSpanAttrs are h's attributes on a wait span (and its link).
func holderSpanAttrs(h holders.Holder) []attribute.KeyValue {
	site := h.Site
	if site == "" && h.Running && h.Statement != "" {
		site = "statement " + strconv.Quote(holders.Truncate(h.Statement, 120))
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

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holders.Holder {
	if oc == nil {
		return holders.Holder{}
	}
	return holders.Holder{Database: oc.connector.pool, Conn: oc.id, PID: oc.shownPID()}
}
