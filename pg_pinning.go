package lockhooks

import (
	"context"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/binary"
	"fmt"

	"github.com/lockhooks/lockhooks/internal/advisorykey"
	"github.com/lockhooks/lockhooks/internal/pgsession"
	"github.com/lockhooks/lockhooks/internal/rawconn"
	"github.com/lockhooks/lockhooks/internal/sqlscan"
	"github.com/lockhooks/lockhooks/internal/stmtlocks"
	"github.com/lockhooks/lockhooks/internal/telemetry"
)

// ErrLockLost is wrapped by the errors that report a lock whose connection
// died (terminated backend, broken network, a cancelled statement that made
// the driver close the connection) or was closed by db.Close, and by those
// that report an AdvisoryLock released by a statement on its own
// connection. The work the lock protected must stop: other processes may
// hold the lock now.
var ErrLockLost = pgsession.ErrLockLost

// ErrNotLockOwner is wrapped by the error returned, instead of Postgres's
// silent false, for a pg_advisory_unlock that cannot be honoured: no
// connection of this database holds the key, or the one that does is in
// use elsewhere.
var ErrNotLockOwner = pgsession.ErrNotLockOwner

// LockID returns the advisory-lock key for name: the last 8 bytes of its
// SHA-256, big-endian, with the top bit cleared, the same as dstack's
// string_to_lock_id.
//
// LockID also remembers name, so that lockhooks shows the key by its name
// wherever it shows it (/debug/locks and its JSON, the slow-wait log,
// errors, span attributes): "nightly-report (4290127349813372591)". This
// memory is the package's one process-wide state: bounded (the last few
// thousand names), it costs a read-locked map lookup when the name is
// already known and one insertion when it is not.
func LockID(name string) int64 {
	k := lockID(name)
	keyNames.Remember(k, name)
	return k
}

// lockID is LockID without remembering the name.
func lockID(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[24:]) & (1<<63 - 1))
}

// heldLock is one session lock a connection holds (pgsession.Held).
type heldLock = pgsession.Held

// InTx reports whether the connection is inside a transaction block, opened
// by database/sql or by statement text.
func (c *conn) InTx() bool {
	if c.tx.inner != nil {
		return true
	}
	c.pin.Lock()
	defer c.pin.Unlock()
	return c.pin.TextTx
}

// advisoryPlan is what the hooks do around one statement that calls
// advisory-lock functions, or that runs on a connection holding locks.
type advisoryPlan struct {
	// Plan is what the session-lock tracking knows of the statement (its
	// advisory calls, text, site, keys), which it applies after it
	// (pgsession.Conn.After).
	pgsession.Plan[lockKey]
	st   statement
	args []driver.NamedValue
	wait *lockWait // the statement's lock wait, when it takes locks
	// sent is the text the statement runs with when it is not its own: an
	// exact session-lock statement on a connection that reaches the server
	// itself carries the holder's annotation instead of a pg_locks read
	// after it (pgsession.Conn.LockText); "" otherwise.
	sent string
	// turn: the statement took its key's turn in the in-process queue
	// before it was sent (pg_turns.go).
	turn bool
}

// beforeAdvisory runs before a statement on the slow path. It may answer
// the statement itself (a rerouted unlock): then answer is the statement's
// result. retext says that the statement's text may be sent changed (it
// is not a prepared statement): see advisoryPlan.sent.
func (c *conn) beforeAdvisory(ctx context.Context, st statement, args []driver.NamedValue, retext bool) (plan advisoryPlan, answer *rawconn.Row, err error) {
	plan = advisoryPlan{Plan: pgsession.Plan[lockKey]{Adv: st.advisory, Text: st.text}, st: st, args: args}
	c.pin.Trips.Sent(st.text)
	c.pin.Lock()
	lost := c.pin.Lost
	c.pin.Unlock()
	if lost != nil {
		return plan, nil, lost
	}
	if err := c.refuseThroughPooler(st.advisory); err != nil {
		return plan, nil, err
	}
	if c.pin.Active.Load() {
		// database/sql would let the driver see a cancelled context, and pgx
		// then closes the connection: every lock it holds would be gone.
		if err := ctx.Err(); err != nil {
			return plan, nil, err
		}
		c.pin.VerifyUnknown(ctx)
	}
	adv := st.advisory
	if adv == nil {
		if err := c.pin.Hold.Check(ctx); err != nil {
			return plan, nil, err
		}
		if st.rowLock {
			plan.wait = c.startRowLockWait(ctx, st)
		}
		return plan, nil, nil
	}
	plan.Keys, plan.Known = pgsession.KeySlices[lockKey](len(adv.Calls))
	plan.Exact = adv.TargetList && !adv.Uncertain
	plan.Verify = !plan.Exact && !adv.DiscardAll
	for i, call := range adv.Calls {
		k, ok := keyOf(call, args)
		if !ok && call.Func&sqlscan.FnUnlockAll == 0 && adv.TargetList && !adv.Uncertain {
			if k, ok = c.evalKey(ctx, call, args); ok {
				plan.Verify = true
			}
		}
		plan.Keys[i], plan.Known[i] = k, ok || call.Func&sqlscan.FnUnlockAll != 0
		plan.Exact = plan.Exact && plan.Known[i]
	}
	if c.pin.AnyApprox(plan.Keys, plan.Known) {
		plan.Verify = true
	}
	if plan.OnHolder, err = c.pin.OnHolder(adv); err != nil {
		return plan, nil, err
	}
	if !plan.OnHolder {
		if err := c.pin.Hold.Check(ctx); err != nil {
			return plan, nil, err
		}
	}
	if c.connector.opts.txPooler {
		if err := c.pin.SplitConflict(adv, plan.Keys, plan.Known); err != nil {
			return plan, nil, err
		}
	}
	if err := c.pin.RefuseUselessXact(ctx, adv); err != nil {
		return plan, nil, err
	}
	if adv.Simple && adv.Calls[0].Func&sqlscan.FnUnlock != 0 && plan.Known[0] && !c.holds(plan.Keys[0]) {
		if err := c.connector.pins.rerouteUnlock(ctx, c, plan.Keys[0]); err != nil {
			return plan, nil, err
		}
		return plan, rawconn.OneValue(adv.Calls[0].Column, true), nil
	}
	if stmtlocks.OneSessionLock(adv) && adv.Calls[0].Func == sqlscan.FnTry {
		// A try-lock takes the key's turn if it is free, and is answered
		// false without the server if another connection of this database
		// holds or awaits the key (pg_turns.go).
		if key, ok := c.turnKey(plan); ok {
			if !c.connector.Turns.TryLock(key, c, takerOf(ctx, c, nil), nil) {
				// Counted and traced as a try-lock the server refused.
				c.startAdvisoryWait(ctx, adv, plan.Keys, plan.Known, c.siteOf(ctx)).End(ctx, telemetry.OutcomeNotAcquired, nil)
				return plan, rawconn.OneValue(adv.Calls[0].Column, false), nil
			}
			c.notePendingTurn(key)
			plan.turn = true
		}
	}
	annotate := false
	if !plan.OnHolder && plan.Exact && !c.connector.opts.txPooler && pgsession.TakesOrFreesSession(adv) {
		// A session lock through a transaction-mode pooler would land on a
		// server connection other clients reuse: pg_locks, read right
		// after, says whether it is where this connection is, and the read
		// names the holder to other processes. A connection that reaches
		// the server itself needs neither: the statement's text and result
		// tell its effect, and the statement names the holder itself.
		annotate = !plan.Verify && retext && adv.Simple && c.direct && c.connector.own.Exec != nil && c.connector.own.OK() && stmtlocks.IntegerArgs(args)
		plan.Verify = !annotate
	}
	plan.Site = c.siteOf(ctx)
	if annotate {
		// The text may change with every hold: it runs in pgx's
		// QueryExecModeExec (one round trip, the arguments bound by the
		// server, nothing cached) unless the connection sent it lately
		// (sentWith), and either way the server shows it as sent, which
		// an end request compares (pgsession.EndTarget). suffix is
		// AcquireAdvisoryLock's fencing token (see tokenAfterLockKey).
		suffix := ""
		if adv.Calls[0].Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll|sqlscan.FnXact) == 0 && ctx.Value(tokenAfterLockKey{}) != nil {
			suffix = ", " + tokenExpr // AcquireAdvisoryLock's, with its fencing token
		}
		unlock := adv.Calls[0].Func&sqlscan.FnUnlock != 0
		plan.sent = c.pin.LockText(ctx, unlock, plan.Keys[0], plan.Site, st.text, suffix)
	}
	if plan.Exact && !adv.Simple {
		if err := c.checkUnlocks(adv, plan.Keys, plan.Site); err != nil {
			return plan, nil, err
		}
	}
	c.warnSelfWait(adv, plan.Keys, plan.Known, plan.Site)
	hint, err := c.selfWaitAdvisory(ctx, func() string { return fmt.Sprintf("the statement %.120q", st.text) }, stmtlocks.Waiting(adv, plan.Keys, plan.Known), nil)
	if err != nil {
		c.connector.Events.Add(eventSelfWait, err.Error())
		return plan, nil, err
	}
	plan.wait = c.startAdvisoryWait(ctx, adv, plan.Keys, plan.Known, plan.Site)
	plan.wait.NoteSelfHint(hint)
	if stmtlocks.OneSessionLock(adv) && adv.Calls[0].Func == 0 {
		if key, ok := c.turnKey(plan); ok {
			if err := c.takeTurn(ctx, key); err != nil {
				plan.wait.End(ctx, "", err)
				return plan, nil, err
			}
			plan.turn = true
			c.pin.Trips.Sent(st.text) // sent now, after its wait in memory (pg_loss.go's quiet)
		}
	}
	c.pin.Lock()
	c.pin.Busy++
	c.pin.Gen++
	c.pin.Unlock()
	return plan, nil, nil
}

// checkUnlocks looks at the unlocks of a statement of several calls whose
// keys this connection does not hold at that point. An unlock inside a
// larger statement cannot be sent to another connection: if another
// connection of this database holds the key, the statement is refused with
// ErrNotLockOwner naming it; if none does, the statement runs as written
// (Postgres answers false for that call, as it would without lockhooks) and
// a warning says so.
func (c *conn) checkUnlocks(adv *sqlscan.Advisory, keys []lockKey, site string) error {
	c.pin.Lock()
	unheld := c.pin.UnheldUnlocksLocked(adv.Calls, keys)
	c.pin.Unlock()
	for _, k := range unheld {
		if h, ok := c.connector.pins.HolderOf(k, c); ok {
			err := fmt.Errorf("%w: pg_advisory_unlock%s(%s) on %v, in a statement with other advisory calls: the lock is held by %v, and an unlock inside a larger statement cannot be sent there; unlock it in a statement of its own", ErrNotLockOwner, pgsession.SharedSuffix(k), k, c, h)
			c.connector.Events.Add(eventUnlockRefused, err.Error())
			c.connector.tel.UnlockRefused(context.Background())
			return err
		}
		c.connector.opts.logger.Warn("lockhooks: an unlock of a key this connection does not hold, inside a statement with other advisory calls; Postgres answers false for it",
			"key", k.String(), "connection", c.String(), "at", site)
	}
	return nil
}

// warnSelfWait logs a lock request that will wait for a connection of this
// same database parked with the lock: if the same code path took it, the
// request waits for itself.
func (c *conn) warnSelfWait(adv *sqlscan.Advisory, keys []lockKey, known []bool, site string) {
	for i, call := range adv.Calls {
		if call.Func&(sqlscan.FnTry|sqlscan.FnUnlock|sqlscan.FnUnlockAll) != 0 || !known[i] {
			continue
		}
		k := keys[i]
		if c.holds(k) {
			continue
		}
		h, ok := c.connector.pins.HolderOf(k, c)
		if !ok {
			continue
		}
		h.pin.Lock()
		parked, l := h.pin.Parked, h.pin.Held[k]
		var taken string
		if l != nil {
			taken = l.Site
		}
		h.pin.Unlock()
		if parked && (!k.Shared || h.holds(advisorykey.Exclusive(k))) {
			c.connector.opts.logger.Warn("lockhooks: an advisory lock request waits for a connection of this same database that holds the lock outside the pool; if the same code took it, it waits for itself: unlock it first (pg_advisory_unlock through this database), or take locks with lockhooks.AcquireAdvisoryLock",
				"key", k.String(), "requested_at", site, "holder", h.id, "holder_pid", h.pin.PID.Load(), "taken_at", taken)
		}
	}
}
