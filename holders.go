package lockhooks

import (
	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/holders"
	"github.com/lockhooks/lockhooks/internal/holding"
	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// The model of holders and waiters, one per process.
//
// Every lockhooks database (a connector) joins the process's registry when
// it is opened and leaves it at Close. A holder (a connection that holds a
// lock, or is inside a transaction) has one identity: its database (pool
// name), connection number and backend pid, built here (connHolder), and
// what it holds, built by internal/holding from the connection as a
// holding.Conn (below): its Go call site (where it took the lock, or
// where its transaction began), since when, and span context. Errors, the
// slow-wait log, spans, metrics and /debug/locks ask the model who holds
// what a waiter waits for and only format the answer, so a holder is
// named the same way everywhere, also when it is a connection of another
// *sql.DB of the process (another replica of the same service, say).
//
// The value, and how every consumer formats it, is package
// internal/holders; its span attributes are internal/telemetry's.

// Identity is the connection as a holder, without what it holds
// (holding.Conn).
func (c *conn) Identity() holders.Holder { return connHolder(c) }

// Locks is the connection's session-lock tracking as the model reads it,
// nil on a database that tracks none (holding.Conn).
func (c *conn) Locks() holding.Locks[lockKey] {
	if c.connector.pins == nil {
		return nil
	}
	return &c.pin
}

// Transaction is the connection's open transaction as other goroutines
// see it (holding.Conn).
func (c *conn) Transaction() *holding.Tx { return &c.ident }

// Run is RunInTx's fn whose transaction the connection runs, or nil
// (holding.Conn).
func (c *conn) Run() *callsite.Run { return c.selfRun.Load() }

// connHolder is the identity of connection oc, without what it holds.
func connHolder(oc *conn) holders.Holder {
	if oc == nil {
		return holders.Holder{}
	}
	return holders.Holder{Database: oc.connector.Pool, Conn: oc.id, PID: oc.shownPID()}
}

// Pin is the connection's session-lock tracking (lockdb.Conn).
func (c *conn) Pin() *pgsession.Conn[lockKey] { return &c.pin }
