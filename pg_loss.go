package lockhooks

import (
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/lockhooks/lockhooks/internal/dberr"
	"github.com/lockhooks/lockhooks/internal/pgsession"
)

// Lost locks, the connection's parts: telling a broken connection from a
// failed statement, reporting a loss (recording it, and ending the
// backend of a holder lockhooks gave up on, are pgsession.Conn.MarkLostOn's),
// and whether a pooler stands between the connection and its backend
// (ThroughPooler), which the rule for ending a backend asks
// (internal/pgsession's package comment; its first point is
// pgsession.Conn.Endable).

// ConnectionBroken reports whether err means the connection is gone, so its
// session locks are too: a driver error that is not the server's, or the
// server's own "terminating connection" and connection-exception errors:
// any FATAL (the server ends the session after it), among them 57P01
// (pg_terminate_backend), 57P05 (idle_session_timeout) and 25P03
// (idle_in_transaction_session_timeout) (dberr.SessionEnded).
func (c *conn) ConnectionBroken(err error) bool {
	if errors.Is(err, driver.ErrBadConn) {
		return true
	}
	if ended, isServer := dberr.SessionEnded(err); isServer {
		return ended
	}
	if !c.suspect.Load() {
		return false
	}
	// Not the server's error: ask whether the connection is still there.
	return !c.alive()
}

// alive pings the connection.
func (c *conn) alive() bool {
	if c.pinger == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return c.pinger.Ping(ctx) == nil
}

// LoseLocks records that c's session locks are gone because its
// connection died, reports it (log, metric, Lost), has the backend ended
// where it still lives, and returns the error to give to whoever relied on
// them (nil if c held none). The caller settles c afterwards (a parked one
// is closed).
func (c *conn) LoseLocks(cause error) error {
	c.endTransactionLocks()
	return c.MarkLost("its connection died ("+cause.Error()+")", cause, pgsession.LossReport|pgsession.LossEnd)
}

// endTransactionLocks has the backend of a connection that died inside a
// transaction ended where it still holds the transaction-level locks
// lockhooks saw the transaction take: a half-open connection's backend
// keeps its transaction, and them, open until TCP keepalive. (Through a
// transaction pooler the transaction's backend is the pooler's to drop.)
func (c *conn) endTransactionLocks() {
	if c.connector.pins == nil || !c.endable() {
		return
	}
	c.pin.Lock()
	keys := c.pin.XactKeysLocked()
	c.pin.Unlock()
	if t := c.pin.EndTarget(); t.PID != 0 && len(keys) > 0 {
		c.connector.pins.Ends().Add(t, pgsession.CoreKeys(keys), false)
	}
}

// MarkLost records that the session locks of c's lock backend are gone
// (why completes "…held advisory lock k and"): pgsession.Conn.MarkLostOn.
func (c *conn) MarkLost(why string, cause error, flags pgsession.LossFlags) error {
	return c.pin.MarkLostOn(c.LockPID(), why, cause, flags)
}

// ReportLoss logs and counts the loss of l.N session locks of c's backend
// l.PID, records it among the events and as a span, linked to the span
// the oldest was taken in.
func (c *conn) ReportLoss(l pgsession.Loss) {
	c.connector.tel.LockLost(context.Background(), "advisory", l.N)
	c.connector.Events.Add(eventLockLost, l.Err.Error())
	heldFor := time.Since(l.Oldest.Since).Round(time.Millisecond)
	attrs := []any{"database", c.connector.Pool, "connection", c.id, "backend_pid", l.PID,
		"keys", l.Keys, "taken_at", l.Oldest.Site, "held_for", heldFor.String(), "parked", l.Parked, "cause", l.Cause.Error()}
	if l.Backend != "" {
		attrs = append(attrs, "backend", l.Backend)
	}
	c.connector.opts.logger.Error("lockhooks: advisory lock lost", attrs...)
	// A span of its own (issue 20: the model of holders), linked to the
	// span the lock was taken in.
	h := connHolder(c).TookLock(l.Keys, l.Oldest.Site, l.Oldest.Since, l.Oldest.Span)
	c.connector.tel.LockLostSpan(h, l.Cause)
}

// LockLost frees the in-process turn of the AdvisoryLock held on c, if
// any: another acquirer of this process may take the key at once.
func (c *conn) LockLost() {
	if l := c.advisory.Load(); l != nil {
		l.freeTurn()
	}
}

// Ends is c's database's queue of backends to end.
func (c *conn) Ends() *pgsession.EndQueue { return c.connector.pins.Ends() }

// noteRoundTrip runs run, a round trip of a statement of text ("" when it
// need not be recognised), noted as the backend's last statement should
// c's connection break: sent before, and answered after unless run failed
// outside the server.
func (c *conn) noteRoundTrip(text string, run func() error) error {
	c.pin.Trips.Sent(text)
	err := run()
	if err == nil || dberr.FromServer(err) {
		c.pin.Trips.Answered()
	}
	return err
}

// endable reports whether lockhooks may end c's backend after a loss: c
// reached the server itself and no pooler is declared or seen (see the
// rule of internal/pgsession).
func (c *conn) endable() bool { return c.pin.Endable(c.ThroughPooler()) }

// ThroughPooler reports whether a pooler stands between c and the server:
// declared (either kind), or seen.
func (c *conn) ThroughPooler() bool {
	o := c.connector.opts
	return o.txPooler || o.pinningPooler || c.connector.pins.PoolerSeen() != nil
}
