package pgsession

import (
	"context"
	"database/sql/driver"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/lockhooks/lockhooks/internal/sqlscan"
)

// What a statement's answer does to the connection's tracking: the keys
// it granted or released applied to the held set, transaction-level locks
// and transaction control followed, and the breaks that end a statement's
// certainty.

// Plan is what the tracking knows of one statement on the slow path (one
// that calls advisory-lock functions, or that runs on a connection
// holding locks), made before it runs and applied after (Conn.After).
type Plan[K Key] struct {
	// Adv is the statement's advisory calls as the scanner found them;
	// nil when it has none.
	Adv *sqlscan.Advisory
	// Text is the statement's text, as the user sent it.
	Text string
	// Site is where the application sent it.
	Site string
	// Keys is the key of each of Adv's calls, where Known.
	Keys  []K
	Known []bool
	// Exact: each call runs once (a target list) and every key is known,
	// so the effect on locks follows from the text and the results.
	Exact bool
	// Verify: read pg_locks after the statement (keys evaluated apart
	// from the statement, or effects the text does not show).
	Verify bool
	// OnHolder: the statement runs on the connection's holder
	// (WithTransactionPooler).
	OnHolder bool
}

// After runs after a statement of plan (for queries: after its rows were
// closed), which failed with err or not, and brings the tracking up to
// date; it returns the statement's error, or the loss it met. results
// holds the first row of a target list, when the statement was a query
// whose row lockhooks saw; nil otherwise. A statement with advisory calls
// has counted itself in Busy (the caller, before it ran); After counts it
// out. On a connection whose tracking was never set up (Init) it returns
// err and does nothing.
func (c *Conn[K]) After(ctx context.Context, plan *Plan[K], results []driver.Value, err error) error {
	if c.host == nil {
		return err // not tracked (Init never ran: not a Postgres connection)
	}
	adv := plan.Adv
	if adv == nil {
		if err != nil && c.host.ConnectionBroken(err) {
			lost := c.host.LoseLocks(err)
			c.host.Settle() // the monitor ends its backend
			return LostError(lost, err)
		}
		c.FollowTxControl(plan.Text, false, err != nil)
		return err
	}
	defer func() {
		c.Lock()
		c.Busy--
		c.Gen++
		c.Unlock()
	}()
	span := trace.SpanContextFromContext(ctx)
	// lockhooks' own statements below run whether or not ctx ended
	// (context.WithoutCancel, made where one runs: it costs an
	// allocation).
	if err != nil {
		if c.host.ConnectionBroken(err) {
			c.endAfterBreak(plan)
			lost := c.host.LoseLocks(err)
			c.host.Settle() // the monitor ends its backend
			return LostError(lost, err)
		}
		// Any error on a statement that may have taken or released a lock
		// makes the server say what the backend holds now: a lock_timeout
		// (55P03), statement_timeout or cancel (57014) or deadlock (40P01)
		// racing the grant leaves the lock granted; a statement of several
		// calls may have run some of them. One read, on the error path
		// only. (Inside a transaction the error aborted it, the read fails,
		// and the connection is read once the transaction ends.)
		if len(adv.Calls) > 0 {
			inTx := c.host.InTx()
			switch rerr := c.Reconcile(context.WithoutCancel(ctx), plan.Site, nil, !adv.Simple || !plan.Exact); {
			case rerr == nil:
			case c.host.ConnectionBroken(rerr):
				if lost := c.host.LoseLocks(rerr); lost != nil {
					err = LostError(lost, err)
				}
			case !inTx:
				// (inside a transaction the read is made once it ends)
				c.MarkUnverified()
			}
		}
		c.host.LoseIfReleased(plan.Text) // (a statement of several calls may have run its unlock)
		c.host.Settle()
		if c.set.TxPooler {
			c.Hold.EndIfEmpty()
		}
		return err
	}
	if adv.DiscardAll {
		c.Clear()
		// DISCARD ALL also deallocates the server's prepared statements
		// behind the driver's back (pgx caches them): the connection is
		// closed instead of pooled once it is returned, and lockhooks' own
		// queries change their text so the driver prepares them anew.
		c.Discards.Add(1)
	}
	var pending map[K]int
	if plan.Exact {
		pending = c.apply(span, plan, results)
	}
	if adv.Statements > 1 {
		c.FollowTxControl(plan.Text, true, false)
	}
	var verr error
	if plan.Verify || len(pending) > 0 {
		switch verr = c.Reconcile(context.WithoutCancel(ctx), plan.Site, pending, !plan.Exact); {
		case errors.Is(verr, ErrTransactionPooler):
			// The statement ran on another backend than the connection's:
			// its locks cannot be trusted.
			c.MarkLostOn(c.LockPID(), verr.Error(), verr, LossReport|LossPooler) // not ours to end: other clients use that backend
		case verr != nil && c.host.ConnectionBroken(verr):
			verr = LostError(c.host.LoseLocks(verr), verr)
		default:
			verr = nil // a failed read was logged; the next one catches up
		}
	}
	c.host.LoseIfReleased(plan.Text) // an AdvisoryLock's key released on its own connection
	c.host.Settle()
	if c.set.TxPooler {
		c.Hold.EndIfEmpty()
	}
	return verr
}

// endAfterBreak has the backend of a connection that broke during a
// statement taking locks ended, where it holds or awaits one of the keys
// the statement asked for: the server may have granted the lock as the
// connection broke, or grant it later to a backend whose client's side is
// gone (half-open), and nobody could unlock it. Only keys the statement
// named (a call whose key lockhooks could not resolve, in a DO block or a
// function, is left alone), and not through a pooler: there the holder's
// own failure does it (TxHolder.Failed), and an undeclared pooler's
// backend serves others.
func (c *Conn[K]) endAfterBreak(plan *Plan[K]) {
	if !c.Endable(c.host.ThroughPooler()) {
		return // (a pinning pooler may have run the statement on another backend than PID)
	}
	var keys []K
	for i, call := range plan.Adv.Calls {
		if call.Func&(sqlscan.FnUnlock|sqlscan.FnUnlockAll) == 0 && i < len(plan.Known) && plan.Known[i] {
			keys = append(keys, plan.Keys[i])
		}
	}
	if t := c.EndTarget(); t.PID != 0 && len(keys) > 0 {
		c.host.Ends().Add(t, CoreKeys(keys), false)
	}
}

// apply records the effect of a target list whose keys are all known,
// call by call, left to right (span: the statement's; State.ApplyLocked).
// It returns the try-locks whose outcome only pg_locks can tell (negative
// counts: transaction-level ones).
func (c *Conn[K]) apply(span trace.SpanContext, plan *Plan[K], results []driver.Value) (pending map[K]int) {
	inTx := c.host.InTx()
	c.Lock()
	defer c.Unlock()
	pending = c.ApplyLocked(plan.Adv.Calls, plan.Keys, results, inTx, plan.Site, span, c.host.HoldEnded)
	c.UpdateLocked()
	return pending
}

// FollowTxControl follows the transaction blocks that statement text
// opens and closes, outside the transactions the caller began (BeginTx:
// Host.TxBegun): the transaction-level locks of a block end with it. It
// reads the text of statements on connections lockhooks follows
// (Active), or always for advisory texts. A failed statement opens no
// block, but a failed COMMIT still ends one.
func (c *Conn[K]) FollowTxControl(text string, always, failed bool) {
	if c.host.TxBegun() {
		return
	}
	c.Lock()
	if !always && !c.Active.Load() && !c.TextTx {
		c.Unlock()
		return
	}
	effect := sqlscan.TxControl(text)
	if failed && effect != sqlscan.TxEnd {
		effect = sqlscan.TxNone
	}
	switch effect {
	case sqlscan.TxNone:
		c.Unlock()
		return
	case sqlscan.TxBegin:
		c.TextTx = true
		c.UpdateLocked()
		c.Unlock()
		return
	}
	c.TextTx = effect == sqlscan.TxChain
	c.Unlock()
	c.TransactionEnded() // COMMIT or ROLLBACK: the text does not say which took effect
}

// TransactionEnded forgets the transaction-level locks of the
// transaction that just ended and, if a statement in it changed session
// locks in ways only pg_locks can tell, reads pg_locks now that the
// transaction's own locks are gone.
func (c *Conn[K]) TransactionEnded() {
	c.Lock()
	recheck := c.EndTransactionLocked()
	c.UpdateLocked()
	c.Unlock()
	if recheck {
		c.Reconcile(context.Background(), "unknown", nil, true)
		c.host.LoseIfReleased("")
		c.host.Settle()
	}
}
