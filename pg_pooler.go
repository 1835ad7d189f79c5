package lockhooks

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// ErrTransactionPooler is wrapped by the error returned when a session
// advisory lock goes through a transaction-mode pooler (PgBouncer with
// pool_mode = transaction, and the poolers of hosted Postgres built the
// same way) on a database not opened with [WithTransactionPooler]: the
// pooler hands the server connection holding the lock to other clients
// after each transaction, so the lock is stranded there. Once lockhooks
// has seen the pooler (two of its clients on one server connection, or a
// connection's statements on another one), the database refuses session
// locks, and the locks already held are reported lost ([ErrLockLost] and
// this error): their connections' next statements fail, and Lost closes.
var ErrTransactionPooler = pgsession.ErrTransactionPooler

// WithTransactionPooler says the DSN goes through a transaction-mode pooler
// (PgBouncer pool_mode = transaction, Supabase's and Neon's poolers; RDS
// Proxy pins sessions instead: [WithSessionPinningPooler]). Only an open
// transaction keeps a server connection assigned to one client there, so
// each connection that takes a session advisory lock
// gets a holder connection of its own whose transaction stays open while it
// holds anything; the lock and unlock statements run there and return its
// results. The application's own statements keep their meaning: they run
// on the connection as before, autocommit commits at once, and a
// migration's CREATE INDEX CONCURRENTLY still runs outside a transaction.
//
// The cost: one more client connection per lock-holding connection, one
// open transaction, which holds back vacuum's horizon, per lock holder for
// as long as it holds, and one round trip (a ping of the holder) before
// each statement and COMMIT of the protected work, so that none runs once
// the holder is gone. Watch idle_in_transaction_session_timeout and the
// pooler's idle_transaction_timeout: a holder killed by either is a lost
// lock, reported as any other (ErrLockLost).
//
// A statement that mixes a session-lock call with other work (a DO block,
// a call in FROM or WHERE, a session and a transaction-level call together)
// cannot be split between the holder and the connection, and is refused.
// Transaction-level locks (Lock, pg_advisory_xact_lock inside a
// transaction) need no holder and work through such a pooler as they are.
func WithTransactionPooler() Option {
	return func(o *options) { o.txPooler = true }
}

// LockPID returns the backend pid whose pg_locks rows are this
// connection's session locks (pgsession.Conn.LockPID).
func (c *conn) LockPID() int32 { return c.pin.LockPID() }

// shownPID is the backend pid messages name c by: through a transaction
// pooler the backend c met at connect serves other clients, so only its
// holder connection's (0: none known).
func (c *conn) shownPID() int32 {
	if c.connector.opts.txPooler {
		return c.pin.Hold.PID()
	}
	return c.pin.PID.Load()
}

// The connection as the host of its transaction-pooler holder
// (pgsession.HolderHost).

// HolderLost records that the session locks on c's holder's backend pid
// are lost with the holder, whose statement failed with err.
func (c *conn) HolderLost(pid int32, err error) error {
	lost := c.pin.MarkLostOn(pid, "its connection died ("+err.Error()+")", err, pgsession.LossReport)
	return pgsession.LostError(lost, err)
}

// HoldsNothing reports whether c holds no session lock.
func (c *conn) HoldsNothing() bool { return c.pin.HoldsNothing() }

// PoolerDetected is the error for a connection found on a backend other
// than the one it was opened on, or whose lock is not where it was taken
// (pgsession.PoolerError).
func (c *conn) PoolerDetected(what string) error { return pgsession.PoolerError(c, what) }

// The undeclared-pooler guard. Each connection leaves a marker of its own
// on its backend when it opens, in the same statement that reads the
// backend pid: the custom setting lockhooks.session, set for the session.
// In a direct connection (or through a session-mode pooler) no other client
// runs on a backend while its connection lives, so the marker stays, and
// the backend pid does not change. Through a transaction-mode pooler other
// clients use the backend between transactions. lockhooks' own statements
// read both back, at no extra round trip: the reads of pg_locks after lock
// statements, each new connection's first statement, and the monitor's
// check. Any of them finding a backend shared between two open connections
// (another's marker on a connection's backend, a connection's statement on
// another backend, the monitor's side connection on a holder's backend)
// proves the pooler: from then on this database refuses session locks, and
// the connections holding them fail their next statement and are reported
// lost, with ErrTransactionPooler.

// marker returns c's session marker: this database's nonce and c's number.
func (c *conn) marker() string {
	if c.mark == "" {
		c.mark = c.connector.pins.Marker(c.id)
	}
	return c.mark
}

// markerToLeave is the session marker c leaves on its backend with the
// read of its pid (pgsession.Conn.Identify, ReadPID): none where a pooler
// is declared (no guard, so no marker; RDS Proxy would pin the connection
// for a setting).
func (c *conn) markerToLeave() string {
	if c.connector.opts.txPooler || c.connector.opts.pinningPooler {
		return ""
	}
	return c.marker()
}

// settleMarker records what the read of c's pid said of its marker: the
// one that was on c's backend before is looked at (sawMarker); where none
// was left (none asked for, or the server refused it), c has none.
func (c *conn) settleMarker(got pgsession.Opened) {
	if !got.Marked {
		c.mark = ""
		return
	}
	c.sawMarker(got.Marker, strconv.Itoa(int(c.pin.PID.Load())))
}

// sawMarker looks at the marker that was on c's backend when c opened. A
// backend that served another lockhooks connection before proves a pooler
// only if that connection is still open (a session-mode pooler reuses
// backends too, one client after another): one of this database's own.
func (c *conn) sawMarker(m, pid string) {
	if c.mark == "" || m == "" || m == c.mark || !strings.HasPrefix(m, pgsession.MarkerPrefix) {
		return
	}
	if o, ok := c.connector.pins.OwnerOf(m); ok && o != c {
		c.connector.pins.SawPooler(c.PoolerDetected(fmt.Sprintf("was opened on backend pid %s, which %v, still open, was opened on too", pid, o)))
	}
}
