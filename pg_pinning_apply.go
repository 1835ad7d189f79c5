package lockhooks

// What an advisory-lock statement's answer does to a connection's tracking:
// the keys it granted or released applied to the held set, transaction-level
// locks and transaction control followed, and the breaks that end a
// statement's certainty.

import (
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/callsite"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// afterAdvisory runs after the statement (for queries: after its rows were
// closed) and brings the connection's lock tracking up to date. results
// holds the first row of a target list, when the statement was a query
// whose row lockhooks saw; nil otherwise.
func (c *conn) afterAdvisory(ctx context.Context, plan advisoryPlan, results []driver.Value, err error) error {
	adv := plan.st.advisory
	if adv == nil {
		if err != nil && c.ConnectionBroken(err) {
			lost := c.LoseLocks(err)
			c.connector.pins.Settle(c) // the monitor ends its backend
			return pgsession.LostError(lost, err)
		}
		c.followTxControl(plan.st.text, false, err != nil)
		return err
	}
	defer func() {
		c.pin.Lock()
		c.pin.Busy--
		c.pin.Gen++
		c.pin.Unlock()
	}()
	span := trace.SpanContextFromContext(ctx)
	// lockhooks' own statements below run whether or not ctx ended
	// (context.WithoutCancel, made where one runs: it costs an
	// allocation).
	if err != nil {
		if c.ConnectionBroken(err) {
			c.endAfterBreak(plan)
			lost := c.LoseLocks(err)
			c.connector.pins.Settle(c) // the monitor ends its backend
			return pgsession.LostError(lost, err)
		}
		// Any error on a statement that may have taken or released a lock
		// makes the server say what the backend holds now: a lock_timeout
		// (55P03), statement_timeout or cancel (57014) or deadlock (40P01)
		// racing the grant leaves the lock granted; a statement of several
		// calls may have run some of them. One read, on the error path
		// only. (Inside a transaction the error aborted it, the read fails,
		// and the connection is read once the transaction ends.)
		if len(adv.Calls) > 0 {
			inTx := c.InTx()
			switch rerr := c.pin.Reconcile(context.WithoutCancel(ctx), plan.site, nil, !adv.Simple || !plan.exact); {
			case rerr == nil:
			case c.ConnectionBroken(rerr):
				if lost := c.LoseLocks(rerr); lost != nil {
					err = pgsession.LostError(lost, err)
				}
			case !inTx:
				// (inside a transaction the read is made once it ends)
				c.pin.MarkUnverified()
			}
		}
		c.loseIfReleased(plan.st.text) // (a statement of several calls may have run its unlock)
		c.connector.pins.Settle(c)
		if c.connector.opts.txPooler {
			c.pin.Hold.EndIfEmpty()
		}
		return err
	}
	if adv.DiscardAll {
		c.pin.Clear()
		// DISCARD ALL also deallocates the server's prepared statements
		// behind the driver's back (pgx caches them): the connection is
		// closed instead of pooled once it is returned, and lockhooks' own
		// queries change their text so the driver prepares them anew.
		c.pin.Discards.Add(1)
	}
	var pending map[lockKey]int
	if plan.exact {
		pending = c.apply(span, plan, results)
	}
	if adv.Statements > 1 {
		c.followTxControl(plan.st.text, true, false)
	}
	var verr error
	if plan.verify || len(pending) > 0 {
		switch verr = c.pin.Reconcile(context.WithoutCancel(ctx), plan.site, pending, !plan.exact); {
		case errors.Is(verr, ErrTransactionPooler):
			// The statement ran on another backend than the connection's:
			// its locks cannot be trusted.
			c.MarkLost(verr.Error(), verr, pgsession.LossReport|pgsession.LossPooler) // not ours to end: other clients use that backend
		case verr != nil && c.ConnectionBroken(verr):
			verr = pgsession.LostError(c.LoseLocks(verr), verr)
		default:
			verr = nil // a failed read was logged; the next one catches up
		}
	}
	c.loseIfReleased(plan.st.text) // an AdvisoryLock's key released on its own connection
	c.connector.pins.Settle(c)
	if c.connector.opts.txPooler {
		c.pin.Hold.EndIfEmpty()
	}
	return verr
}

// endAfterBreak has the backend of a connection that broke during a
// statement taking locks ended, where it holds or awaits one of the keys the
// statement asked for: the server may have granted the lock as the
// connection broke, or grant it later to a backend whose client's side is
// gone (half-open), and nobody could unlock it. Only keys the statement
// named (a call whose key lockhooks could not resolve, in a DO block or a
// function, is left alone), and not through a pooler: there the holder's
// own failure does it (pgsession.TxHolder.Failed), and an undeclared pooler's backend
// serves others.
func (c *conn) endAfterBreak(plan advisoryPlan) {
	if !c.endable() {
		return // (a pinning pooler may have run the statement on another backend than c.pin.PID)
	}
	var keys []lockKey
	for i, call := range plan.st.advisory.Calls {
		if call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 && i < len(plan.known) && plan.known[i] {
			keys = append(keys, plan.keys[i])
		}
	}
	if t := c.pin.EndTarget(); t.PID != 0 && len(keys) > 0 {
		c.connector.pins.Ends().Add(t, pgsession.CoreKeys(keys), false)
	}
}

// apply records the effect of a target list whose keys are all known, call
// by call, left to right (span: the statement's; pgsession.State.ApplyLocked).
// It returns the try-locks whose outcome only pg_locks can tell (negative
// counts: transaction-level ones).
func (c *conn) apply(span trace.SpanContext, plan advisoryPlan, results []driver.Value) (pending map[lockKey]int) {
	inTx := c.InTx()
	c.pin.Lock()
	defer c.pin.Unlock()
	pending = c.pin.ApplyLocked(plan.st.advisory.Calls, plan.keys, results, inTx, plan.site, span, c.HoldEnded)
	c.updateActiveLocked()
	return pending
}

// HoldEnded records, for the hold-time metric, a session lock held
// since then that c holds no more.
func (c *conn) HoldEnded(since time.Time) {
	c.connector.tel.RecordHold(context.Background(), "advisory", "session", since)
}

// followTxControl follows the transaction blocks that statement text opens
// and closes, outside database/sql transactions: the transaction-level locks
// of a block end with it. It reads the text of statements on connections
// lockhooks follows (active), or always for advisory texts. A failed
// statement opens no block, but a failed COMMIT still ends one.
func (c *conn) followTxControl(text string, always, failed bool) {
	if c.tx.inner != nil {
		return
	}
	c.pin.Lock()
	if !always && !c.pin.Active.Load() && !c.pin.TextTx {
		c.pin.Unlock()
		return
	}
	effect := sqlscan.TxControl(text)
	if failed && effect != sqlscan.TxEnd {
		effect = sqlscan.TxNone
	}
	switch effect {
	case sqlscan.TxNone:
		c.pin.Unlock()
		return
	case sqlscan.TxBegin:
		c.pin.TextTx = true
		c.updateActiveLocked()
		c.pin.Unlock()
		return
	}
	c.pin.TextTx = effect == sqlscan.TxChain
	c.pin.Unlock()
	c.transactionEnded() // COMMIT or ROLLBACK: the text does not say which took effect
}

// transactionEnded forgets the transaction-level locks of the transaction
// that just ended and, if a statement in it changed session locks in ways
// only pg_locks can tell, reads pg_locks now that the transaction's own
// locks are gone.
func (c *conn) transactionEnded() {
	c.pin.Lock()
	recheck := c.pin.EndTransactionLocked()
	c.updateActiveLocked()
	c.pin.Unlock()
	if recheck {
		c.pin.Reconcile(context.Background(), "unknown", nil, true)
		c.loseIfReleased("")
		c.connector.pins.Settle(c)
	}
}

// holds reports whether c holds the session lock k.
func (c *conn) holds(k lockKey) bool { return c.pin.Holds(k) }

// addXact records transaction-level keys the transaction took through
// lockhooks' own statements (Lock on Postgres).
func (c *conn) addXact(keys []int64, site *callsite.Stack) {
	c.pin.Lock()
	defer c.pin.Unlock()
	c.pin.AddXactKeysLocked(keys, site)
	c.updateActiveLocked()
}
