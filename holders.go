package lockhooks

import (
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
// (connHolder); its span attributes are internal/telemetry's.

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holders.Holder {
	if oc == nil {
		return holders.Holder{}
	}
	return holders.Holder{Database: oc.connector.pool, Conn: oc.id, PID: oc.shownPID()}
}
